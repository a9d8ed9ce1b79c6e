/* The launcher's one preparation before the tool loads (huge_pages.c says why and when). */
#pragma once

/* Executes this program again, with the same arguments, under GLIBC_TUNABLES=…:glibc.malloc.hugetlb=1
 * where that gives its large allocations huge pages. Returns when it does not, or when the exec
 * fails; the environment is then as it was. */
void specrpc_reexec_with_huge_pages(char **argv);
