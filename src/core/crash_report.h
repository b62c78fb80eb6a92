// A report on stderr when the process dies of a fatal signal (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGABRT): the signal, the address at fault (or the process that sent it), the rank
// and the commit the binary was built from, then the return addresses on the stack, as
// `binary(function+offset)[address]` where the binary exports the function's (mangled) name
// and `binary(+offset)[address]` where it does not (`addr2line -f -C -e BINARY OFFSET` names
// those). The signal's default action runs after it, so the process still ends as it would
// have (a core file where allowed, the exit status 128 + the signal's number).
#pragma once

namespace shardtrain::crash_report {

// Installs the handler for this process (once; later calls do nothing). `program` names it in
// the report's first line and must outlive the process (a string literal).
void install(const char* program);
// The rank the report names (-1, the default: none).
void set_rank(int rank);

}  // namespace shardtrain::crash_report
