// The specrpc subcommands.
#pragma once

namespace specrpc::cli {

int cmd_generate(int argc, char ** argv);
int cmd_serve(int argc, char ** argv);
int cmd_lookup(int argc, char ** argv);

}  // namespace specrpc::cli
