// Flags shared by the specrpc subcommands (llama.cpp's names), bound to the engine's option
// structs, whose defaults are the ones --help shows.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "specrpc/engine.hpp"

namespace specrpc::cli {

struct CommonArgs {
    EngineParams   engine;
    SamplingParams sampling;
    SpecParams     spec;
    std::string    spec_types = "auto";   // comma list: draft,ngram,lookup,synth,none; auto = draft if -md
    std::string    grammar_file;
    std::string    lookup_static;         // -lcs: static n-gram cache file
    std::string    lookup_dynamic;        // -lcd: dynamic n-gram cache file (loaded and saved)
    std::string    log_level = "info";
};

// llama.cpp's multi-letter single-dash flags (-md, -ngl, ...) → their long forms, for CLI11.
std::vector<std::string> translate_args(int argc, char ** argv);

void add_model_flags(CLI::App & app, CommonArgs & a);
void add_sampling_flags(CLI::App & app, CommonArgs & a);
void add_spec_flags(CLI::App & app, CommonArgs & a);
// Applies derived settings after parsing (grammar file, spec types, log level). Error → message.
Status finalize(CommonArgs & a);
// Loads the engine with a progress bar on stderr.
Result<std::unique_ptr<Engine>> load_engine(CommonArgs & a);

}  // namespace specrpc::cli
