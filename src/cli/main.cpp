// The `shardtrain` command: parse, validate, run, report. Logic lives in the modules.
#include <cstdio>

int main() {
  std::puts("shardtrain");
  return 0;
}
