#include "dsl/deep_stack.hpp"

#include <pthread.h>

#include <exception>

namespace tessera {
namespace {

thread_local bool on_deep_thread = false;

struct DeepWork {
  const std::function<void()>* work;
  std::exception_ptr thrown;
};

void* run_deep_work(void* arg) {
  auto* job = static_cast<DeepWork*>(arg);
  on_deep_thread = true;
  try {
    (*job->work)();
  } catch (...) {
    job->thrown = std::current_exception();
  }
  return nullptr;
}

}  // namespace

void run_on_deep_stack(const std::function<void()>& work) {
  if (on_deep_thread) return work();
  DeepWork job{&work, nullptr};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_t thread;
  bool started = false;
  // A system that will not reserve the whole stack (strict overcommit, a low ulimit -v) gets
  // the largest of these it will.
  for (size_t bytes = kDeepStackBytes; !started && bytes >= (size_t(64) << 20); bytes /= 4)
    started = pthread_attr_setstacksize(&attr, bytes) == 0 && pthread_create(&thread, &attr, run_deep_work, &job) == 0;
  pthread_attr_destroy(&attr);
  if (!started) return work();
  pthread_join(thread, nullptr);
  if (job.thrown) std::rethrow_exception(job.thrown);
}

}  // namespace tessera
