// Whether processes outside this job keep this machine's cores busy now, and how this process's
// waits and parallel parts answer (OpenMP's OMP_WAIT_POLICY).
//
// A device that splits its kernels over helper threads (its share of the cores) waits for the
// slowest part at every kernel. Beside a process that keeps the cores busy (a compiler, another
// job, a test run) each helper waits for a core of its own at every kernel: the GPT step of one
// device on 2 cores ran 8.6x slower beside a 2-thread spinner, where a fair share of the cores
// makes it 1.5x (bench/contention_bench.cpp). So while other work takes cores, a device runs its
// parts on as many threads as its share of the cores still free (often one: every part in turn,
// the same parts, so the same values).
//
// Waits (barriers, collectives, device threads between jobs) spin a while, then sleep on a futex
// or condition variable (comm/spin_barrier.hpp, comm/process_barrier.cpp). Shortening the spin
// while other work runs was measured and not kept: devices that meet at every collective then
// wait a scheduler slice to be woken, and the dp=2 step beside the spinner took 3.1-3.4x its quiet
// time against 2.2x with the spin.
//
// The load is the share of the cores that neither this process nor its job's other clients on
// this machine (mpirun's local size) used over the last 100 ms or more (/proc/stat and getrusage),
// sampled by whichever caller finds the last sample old: a clock read otherwise.
// TESSERA_WAIT_POLICY: auto (the default) as above; active: every part on its own thread
// whatever the load; passive: as auto, and every wait spins only briefly before sleeping.
#pragma once

namespace tessera {

enum class WaitPolicy { Auto, Active, Passive };
// TESSERA_WAIT_POLICY's value (null or empty: auto); Error naming the policies for any other.
WaitPolicy parse_wait_policy(const char* text);

// Cores' worth of work outside this job over the last interval (0 on the first call, and where
// /proc/stat cannot be read).
double cores_busy_elsewhere();

// Whether other work wants the cores now: at least half a core busy elsewhere (never under the
// active policy).
bool cores_wanted_elsewhere();

// The spins a waiter takes before it sleeps: `spins`, or a few dozen under the passive policy.
int spins_before_sleeping(int spins);

// Of `threads` threads that could run parallel parts of one device's work (its share of the
// machine's cores), how many should: all on a quiet machine; while cores are wanted elsewhere,
// the same share of the cores still free, at least 1.
int threads_free_for(int threads);

}  // namespace tessera
