// The specrpc subcommands.
#pragma once

namespace specrpc::cli {

int cmd_generate(int argc, char ** argv);
int cmd_serve(int argc, char ** argv);
int cmd_lookup(int argc, char ** argv);

// Executes the tool again with glibc.malloc.hugetlb=1 where that gives its large allocations huge
// pages (tools/huge_pages.cpp says when); returns when it does not, or when the exec fails.
void reexec_with_huge_pages(char ** argv);

}  // namespace specrpc::cli
