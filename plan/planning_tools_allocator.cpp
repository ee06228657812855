// jemalloc's settings for the planning tools that link it (meson.build: planning_allocator_dep).
// jemalloc reads this symbol once, at start-up; MALLOC_CONF in the environment still overrides.
//
// background_thread: freed pages are returned to the system by jemalloc's own thread, late,
// instead of by the thread that frees them, at once. A search drops and rebuilds plans of
// similar sizes; purged inline, its pages were faulted back in 250,000 times (3.5 s of system
// time in a 6.3 s GPT-3 175B search on 1,024 H100s, a 2-core Firecracker guest); with the
// background thread, 87,000 faults, 1.2-1.3 s, 4.3-4.4 s in all (docs/PLANNING.md).
extern "C" {
__attribute__((used)) const char* malloc_conf = "background_thread:true";
}
