// A stand-in process for cluster_status_test: sleeps until killed, whatever its arguments, so
// /proc/<pid>/cmdline carries the command line pw-cluster would use.
#include <unistd.h>

int main() {
  while (true) pause();
}
