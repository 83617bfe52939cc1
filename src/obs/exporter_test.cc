// The training exporter alone: steps observed on one thread while clients scrape from
// others (run it under the tsan preset), what a scrape shows, the API key, a port in use.
#include "loom/obs/exporter.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "loom/core/error.h"
#include "loom/obs/metrics.h"

namespace loom::obs {
namespace {

std::string scrape(int port, const std::string& key, int* status) {
  httplib::Client c("127.0.0.1", port);
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  const auto res = c.Get("/metrics", h);
  *status = res ? res->status : 0;
  return res ? res->body : "";
}

TEST(Exporter, StepsObservedWhileScrapedShowTheLatest) {
  TrainingExporter e({.port = 0, .rank = 0, .peak_gflops = 100});
  e.set_run(/*train_flops_per_token=*/6e6, /*world=*/2, /*restarts=*/1, /*steps_lost=*/3);
  int status = 0;
  EXPECT_NE(scrape(e.port(), "", &status).find("loom_train_up{rank=\"0\"} 1"), std::string::npos);
  EXPECT_EQ(status, 200);
  std::atomic<bool> done{false};
  std::vector<std::thread> clients;
  std::atomic<int> good{0};
  for (int c = 0; c < 3; ++c)
    clients.emplace_back([&] {
      while (!done) {
        int s = 0;
        const std::string body = scrape(e.port(), "", &s);
        good += s == 200 && body.ends_with("\n");
      }
    });
  for (int step = 1; step <= 200; ++step) {
    JsonLine l;
    l.add("step", int64_t{step}).add("loss", 5.0 - step * 0.01).add("lr", 1e-3).add("tokens", int64_t{4096})
        .add("step_ms", 100.0).add("tokens_per_s", 40960.0).add("exposed_comm_ms", 10.0).add("data_wait_ms", 5.0)
        .add("mem_params_mb", 1.0).add("mem_step_peak_mb", std::vector<double>{100, 200});
    if (step % 50 == 0) l.add("val_loss", 4.0);
    if (step == 101) l.add("ckpt_stall_ms", 20.0);
    e.observe(l.str());
  }
  // The 200 observes take a few milliseconds; on a loaded machine no scrape may have ended
  // by then (the suite saw it once): the clients go on until one has, for at most 10 s.
  for (int i = 0; i < 1000 && good.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  done = true;
  for (auto& t : clients) t.join();
  EXPECT_GT(good.load(), 0);
  const std::string text = e.text();
  for (const char* line : {"loom_train_step{rank=\"0\"} 200\n", "loom_train_val_loss{rank=\"0\"} 4\n",
                           "loom_train_tokens_total{rank=\"0\"} 819200\n",
                           // 6e6 FLOPs a token x 40960 tokens/s over 2 ranks, against 100 GFLOP/s.
                           "loom_train_model_flops_per_second{rank=\"0\"} 1.2288e+11\n", "loom_train_mfu{rank=\"0\"} 1.2288\n",
                           "loom_train_step_duration_seconds{rank=\"0\",part=\"compute\"} 0.085\n",
                           "loom_train_step_duration_seconds{rank=\"0\",part=\"checkpoint_stall\"} 0\n",
                           "loom_train_time_seconds_total{rank=\"0\",part=\"checkpoint_stall\"} 0.02\n",
                           "loom_train_memory_peak_bytes{rank=\"1\",phase=\"step\"} 209715200\n",
                           "loom_train_restarts_total{rank=\"0\"} 1\n", "loom_train_steps_lost_total{rank=\"0\"} 3\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
}

TEST(Exporter, AKeyIsAskedForAndAPortInUseIsNamed) {
  TrainingExporter e({.port = 0, .api_key = "k", .rank = 3});
  int status = 0;
  scrape(e.port(), "", &status);
  EXPECT_EQ(status, 401);
  scrape(e.port(), "x", &status);
  EXPECT_EQ(status, 401);
  const std::string body = scrape(e.port(), "k", &status);
  EXPECT_EQ(status, 200);
  EXPECT_NE(body.find("loom_train_up{rank=\"3\"} 1"), std::string::npos) << body;
  EXPECT_EQ(body.find("loom_train_restarts_total"), std::string::npos) << "rank 0's books only";
  try {
    TrainingExporter again({.port = e.port()});
    ADD_FAILURE() << "a second server on the same port";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("cannot listen on 127.0.0.1:"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace loom::obs
