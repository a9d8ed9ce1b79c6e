// Flags shared by the specrpc subcommands (llama.cpp's names): CLI11 options built from the
// server's options table (server/server_options.h), so a flag, its environment variables, its
// limits and its help text are the same rows `init` reads.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "server/server_options.h"
#include "specrpc/engine.hpp"

namespace specrpc::cli {

// The load config (engine, sampling, speculation, n-gram cache files), serve's own settings and
// the log level, as the table's rows set them.
using CommonArgs = server::ServerConfig;

// llama.cpp's multi-letter single-dash flags (-md, -ngl, ...) → their long forms, for CLI11.
std::vector<std::string> translate_args(int argc, char ** argv);

// Adds every table row accepted `where` (server::IN_SERVE or IN_TOOLS) to app, writing into a;
// rows with environment variables read them (llama-server's LLAMA_* name when the SPECRPC_* one
// is unset). -m is required unless the caller says otherwise.
void add_options(CLI::App & app, CommonArgs & a, unsigned where);
// Applies derived settings after parsing (log level, then server::finalize_server_config).
// Error → message.
Status finalize(CommonArgs & a);
// Loads the engine with a progress bar on stderr.
Result<std::unique_ptr<Engine>> load_engine(CommonArgs & a);

}  // namespace specrpc::cli
