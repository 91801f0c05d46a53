// The cores a process may compute on: what a worker's thread pool is sized to by default.
#pragma once

namespace pw::cpu {

// CPUs in the calling thread's affinity mask (taskset, cgroup cpusets), else
// std::thread::hardware_concurrency(); at least 1.
int AvailableCores();

}  // namespace pw::cpu
