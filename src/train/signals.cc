// The signals a run answers (loom/train/train.h; docs/launch.md, "Preemption", "Elastic jobs").
#include <csignal>

#include "loom/train/train.h"

namespace loom::train {
namespace {

volatile std::sig_atomic_t g_terminate = 0;
void on_terminate(int) { g_terminate = 1; }

volatile std::sig_atomic_t g_resize = 0;
void on_resize(int) { g_resize = 1; }

void install(int signal, void (*handler)(int)) {
  struct sigaction action{};
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  ::sigaction(signal, &action, nullptr);
}

}  // namespace

void install_terminate_handler() { install(SIGTERM, on_terminate); }
bool terminate_requested() { return g_terminate != 0; }
void install_resize_handler() { install(SIGUSR1, on_resize); }
bool resize_requested() { return g_resize != 0; }

}  // namespace loom::train
