// A stand-in process for cluster_status_test: linked as pw-router, pw-prefill and pw-decode, it
// sleeps until a signal ends it, whatever its arguments, so `pw-cluster up` can start a node
// without a model. Given --print-config (pw-cluster up's check of every process's options) it
// exits 0 at once, as the real processes do with a good file.
#include <unistd.h>

#include <cstring>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--print-config") == 0) return 0;
  }
  while (true) pause();
}
