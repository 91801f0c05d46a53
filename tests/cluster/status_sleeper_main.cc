// A stand-in process for cluster_status_test: linked as pw-router, pw-prefill and pw-decode, it
// sleeps until a signal ends it, whatever its arguments, so `pw-cluster up` can start a node
// without a model.
#include <unistd.h>

int main() {
  while (true) pause();
}
