// Sequence batching (EngineOptions::sequence_batching): routing, order, control inputs, implicit
// state, the backlog, idle slots, Triton's errors, and every request ending on shutdown. The
// model under test is an accumulator that keeps no state of its own: OUTPUT = (START ? 0 : STATE)
// + INPUT, and STATE_OUT = OUTPUT, so a sequence's sums are right only if the engine routes its
// requests in order and carries the state; CORRID is echoed (OUT_ID) to check the control.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/model.hpp"
#include "test_support.hpp"

namespace asyncinfer {
namespace {
using namespace std::chrono_literals;
using testing::eventually;
using testing::get_within;

class Accumulator final : public Model, public std::enable_shared_from_this<Accumulator> {
 public:
  explicit Accumulator(std::chrono::microseconds delay = 0us) : delay_(delay) {
    sig_.batched = true;
    sig_.batch_limit = 8;
    for (const char* n : {"INPUT", "START", "READY"})
      sig_.inputs.push_back({n, DType::i32, {-1, 1}});
    sig_.inputs.push_back({"CORRID", DType::u64, {-1, 1}});
    sig_.inputs.push_back({"STATE", DType::i32, {-1, 1}});
    sig_.outputs.push_back({"OUTPUT", DType::i32, {-1, 1}});
    sig_.outputs.push_back({"OUT_ID", DType::u64, {-1, 1}});
    sig_.outputs.push_back({"STATE_OUT", DType::i32, {-1, 1}});
  }
  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions& o) override {
    return std::unique_ptr<ModelInstance>(
        std::make_unique<Instance>(shared_from_this(), o.worker_index));
  }
  /// Largest batch seen, and (correlation ID → workers that ran it).
  std::int64_t largest_batch() const { return largest_.load(); }
  std::map<std::uint64_t, std::vector<int>> workers_by_id() const {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  class Instance final : public ModelInstance {
   public:
    Instance(std::shared_ptr<Accumulator> m, int worker) : m_(std::move(m)), worker_(worker) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      const std::int64_t rows = io->batch_size;
      std::int64_t was = m_->largest_.load();
      while (rows > was && !m_->largest_.compare_exchange_weak(was, rows)) {
      }
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(DType::i32, {rows, 1}));
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor id, Tensor::empty(DType::u64, {rows, 1}));
      ASYNCINFER_ASSIGN_OR_RETURN(Tensor state, Tensor::empty(DType::i32, {rows, 1}));
      io->outputs = {out, id, state};
      Kernel k;
      k.name = "accumulate";
      k.duration = m_->delay_;
      k.host_fn = [io, rows, m = m_, worker = worker_](std::stop_token) {
        const auto* in = io->host_inputs[0].data_as<std::int32_t>();
        const auto* start = io->host_inputs[1].data_as<std::int32_t>();
        const auto* ready = io->host_inputs[2].data_as<std::int32_t>();
        const auto* corrid = io->host_inputs[3].data_as<std::uint64_t>();
        const auto* st = io->host_inputs[4].data_as<std::int32_t>();
        for (std::int64_t r = 0; r < rows; ++r) {
          if (ready[r] != 1) return internal_error("READY is not 1");
          const std::int32_t acc = (start[r] != 0 ? 0 : st[r]) + in[r];
          io->outputs[0].data_as<std::int32_t>()[r] = acc;
          io->outputs[1].data_as<std::uint64_t>()[r] = corrid[r];
          io->outputs[2].data_as<std::int32_t>()[r] = acc;
          std::lock_guard lock(m->mu_);
          auto& w = m->seen_[corrid[r]];
          if (std::find(w.begin(), w.end(), worker) == w.end()) w.push_back(worker);
        }
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<Accumulator> m_;
    int worker_;
  };

  ModelSignature sig_;
  std::string name_ = "accumulator";
  std::chrono::microseconds delay_;
  std::atomic<std::int64_t> largest_{0};
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::vector<int>> seen_;
};

SequenceBatchingOptions sequences(int slots = 0) {
  SequenceBatchingOptions s;
  s.model_name = "acc";
  s.slots_per_worker = slots;
  s.controls = {{SequenceControl::Kind::start, "START", DType::i32, 0, 1},
                {SequenceControl::Kind::ready, "READY", DType::i32, 0, 1},
                {SequenceControl::Kind::corrid, "CORRID", DType::u64, 0, 1}};
  s.states = {{"STATE", "STATE_OUT", DType::i32, {1}, std::nullopt}};
  return s;
}

std::unique_ptr<Engine> make(std::shared_ptr<Accumulator> m, int workers,
                             SequenceBatchingOptions s) {
  EngineOptions o;
  o.workers = workers;
  o.sequence_batching = std::move(s);
  auto device = open_device("cpu");
  EXPECT_TRUE(device.ok()) << device.status();
  auto e = Engine::create(std::move(m), *device, std::move(o));
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

Inputs value(std::int32_t v) { return {*Tensor::from_values<std::int32_t>({1, 1}, {v})}; }

RequestOptions in_sequence(CorrelationId id, bool start, bool end) {
  RequestOptions o;
  o.sequence = SequenceFlags{std::move(id), start, end};
  return o;
}

TEST(Sequences, TheRequestSignatureLeavesOutControlsAndState) {
  auto e = make(std::make_shared<Accumulator>(), 1, sequences());
  ASSERT_NE(e, nullptr);
  const ModelSignature& r = e->request_signature();
  ASSERT_EQ(r.inputs.size(), 1u);
  EXPECT_EQ(r.inputs[0].name, "INPUT");
  ASSERT_EQ(r.outputs.size(), 2u);  // STATE_OUT stays with the sequence
  EXPECT_EQ(r.outputs[1].name, "OUT_ID");
  EXPECT_EQ(e->signature().inputs.size(), 5u);
}

TEST(Sequences, InterleavedSequencesEachSeeOnlyTheirOwnState) {
  auto model = std::make_shared<Accumulator>(200us);
  auto e = make(model, 2, sequences());
  ASSERT_NE(e, nullptr);
  constexpr int kSequences = 24;  // more than the 16 slots: some wait in the backlog
  constexpr int kSteps = 20;
  std::vector<std::vector<Future<Outputs>>> futures(kSequences);
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < kSequences; ++s) {
      futures[s].push_back(e->submit(
          value(s + 1), in_sequence(std::uint64_t(1000 + s), step == 0, step == kSteps - 1)));
    }
  }
  for (int s = 0; s < kSequences; ++s) {
    for (int step = 0; step < kSteps; ++step) {
      auto out = get_within(futures[s][step], 10s);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ(out->size(), 2u);
      EXPECT_EQ((*out)[0].data_as<std::int32_t>()[0], (s + 1) * (step + 1)) << s << " " << step;
      EXPECT_EQ((*out)[1].data_as<std::uint64_t>()[0], std::uint64_t(1000 + s));
    }
  }
  for (const auto& [id, workers] : model->workers_by_id()) {
    EXPECT_EQ(workers.size(), 1u) << "sequence " << id << " ran on more than one worker";
  }
  EXPECT_GT(model->largest_batch(), 1);  // sequences of one worker share its batches
  // Every END ran: every slot is freed. A batch frees its sequences' slots just after it has
  // delivered its results (their state is kept first), so the last one may still be on its way.
  EXPECT_TRUE(eventually([&] { return e->metrics().sequences_live == 0; }, 5s))
      << e->metrics().sequences_live << " sequences still live";
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.sequence_backlog, 0);
  EXPECT_EQ(m.completed, std::uint64_t(kSequences * kSteps));
}

TEST(Sequences, TritonsErrorsForBadSequenceRequests) {
  auto e = make(std::make_shared<Accumulator>(), 1, sequences());
  ASSERT_NE(e, nullptr);
  auto no_start = e->try_submit(value(1), in_sequence(std::uint64_t(7), false, false));
  ASSERT_FALSE(no_start.ok());
  EXPECT_EQ(no_start.status().message(),
            "inference request for sequence 7 to model 'acc' must specify the START flag on the "
            "first request of the sequence");
  auto zero = e->try_submit(value(1), in_sequence(std::uint64_t(0), true, false));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(),
            "inference request to model 'acc' must specify a non-zero or non-empty correlation ID");
  auto none = e->try_submit(value(1), RequestOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::invalid_argument);
  auto two = e->try_submit({*Tensor::from_values<std::int32_t>({2, 1}, {1, 2})},
                           in_sequence(std::uint64_t(8), true, false));
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().message(),
            "inference request to model 'acc' must specify batch-size 1 due to requirements of "
            "sequence batcher");
  auto text = e->try_submit(value(1), in_sequence(std::string("abc"), true, false));
  ASSERT_FALSE(text.ok());  // CORRID is u64
  EXPECT_NE(std::string(text.status().message()).find("string"), std::string::npos);
  // After END, the ID needs a new START.
  ASSERT_TRUE(get_within(e->submit(value(1), in_sequence(std::uint64_t(9), true, true)), 5s).ok());
  auto after = e->try_submit(value(1), in_sequence(std::uint64_t(9), false, false));
  EXPECT_FALSE(after.ok());
}

TEST(Sequences, AnIdleSequenceLosesItsSlotToTheBacklog) {
  SequenceBatchingOptions s = sequences(/*slots=*/1);
  s.max_sequence_idle = 100ms;
  auto e = make(std::make_shared<Accumulator>(), 1, s);
  ASSERT_NE(e, nullptr);
  // Sequence 1 takes the only slot and vanishes (no END).
  ASSERT_TRUE(get_within(e->submit(value(5), in_sequence(std::uint64_t(1), true, false)), 5s).ok());
  // Sequence 2 waits in the backlog until sequence 1 has been idle 100 ms.
  const auto t0 = Clock::now();
  auto f = e->submit(value(3), in_sequence(std::uint64_t(2), true, false));
  EXPECT_EQ(e->metrics().sequence_backlog, 1);
  auto out = get_within(f, 5s);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].data_as<std::int32_t>()[0], 3);
  EXPECT_GE(Clock::now() - t0, 80ms);
  EXPECT_EQ(e->metrics().sequences_idle_released, 1u);
  // Sequence 1's next request finds no sequence: START is required.
  EXPECT_FALSE(e->try_submit(value(1), in_sequence(std::uint64_t(1), false, false)).ok());
}

TEST(Sequences, ABackloggedSequenceThatTimesOutFailsWithTritonsMessage) {
  auto e = make(std::make_shared<Accumulator>(), 1, sequences(/*slots=*/1));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(get_within(e->submit(value(1), in_sequence(std::uint64_t(1), true, false)), 5s).ok());
  RequestOptions first = in_sequence(std::uint64_t(2), true, false);
  first.timeout = 50ms;
  auto a = e->submit(value(1), first);
  auto b = e->submit(value(2), in_sequence(std::uint64_t(2), false, false));  // no timeout
  auto ra = get_within(a, 5s);
  auto rb = get_within(b, 5s);
  ASSERT_FALSE(ra.ok());
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(ra.status().message(), "timeout of the corresponding sequence has been expired");
  EXPECT_EQ(rb.status().message(), "timeout of the corresponding sequence has been expired");
  EXPECT_EQ(e->metrics().sequence_backlog_expired, 1u);
  EXPECT_EQ(e->metrics().sequence_backlog, 0);
  // Sequence 1 still holds its slot and goes on.
  auto next = get_within(e->submit(value(4), in_sequence(std::uint64_t(1), false, true)), 5s);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].data_as<std::int32_t>()[0], 5);
}

TEST(Sequences, ABackloggedSequenceWhoseRequestsAreCancelledLeavesTheBacklog) {
  auto e = make(std::make_shared<Accumulator>(), 1, sequences(/*slots=*/1));
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(get_within(e->submit(value(1), in_sequence(std::uint64_t(1), true, false)), 5s).ok());
  // Clients that start sequences and go away while they wait for a slot leave nothing behind.
  for (std::uint64_t id = 2; id < 50; ++id) {
    auto f = e->submit(value(1), in_sequence(id, true, false));
    f.cancel();
    EXPECT_FALSE(get_within(f, 5s).ok());
  }
  EngineMetrics m = e->metrics();
  EXPECT_EQ(m.sequence_backlog, 0);
  EXPECT_EQ(m.sequences_live, 1);
  EXPECT_EQ(m.queue_depth, 0);
  EXPECT_FALSE(e->try_submit(value(1), in_sequence(std::uint64_t(2), false, false)).ok());
  // Sequence 1 still holds the slot and goes on.
  auto next = get_within(e->submit(value(2), in_sequence(std::uint64_t(1), false, true)), 5s);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0].data_as<std::int32_t>()[0], 3);
}

TEST(Sequences, ShutdownEndsEveryWaitingRequest) {
  auto e = make(std::make_shared<Accumulator>(2ms), 1, sequences(/*slots=*/2));
  ASSERT_NE(e, nullptr);
  std::vector<Future<Outputs>> fs;
  for (int s = 0; s < 6; ++s) {
    for (int k = 0; k < 5; ++k) {
      fs.push_back(e->submit(value(1), in_sequence(std::uint64_t(s + 1), k == 0, false)));
    }
  }
  e->shutdown(ShutdownMode::cancel, 0ms);
  int ended = 0;
  for (auto& f : fs) {
    auto r = get_within(f, 5s);
    (void)r;
    ++ended;
  }
  EXPECT_EQ(ended, 30);
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.completed + m.shut_down + m.cancelled + m.failed, 30u);
  EXPECT_EQ(m.queue_depth, 0);
}

TEST(Sequences, ThreadsStartCancelAndEndSequencesWhileTheEngineShutsDown) {
  SequenceBatchingOptions opts = sequences(/*slots=*/3);
  opts.max_sequence_idle = 20ms;
  auto e = make(std::make_shared<Accumulator>(50us), 2, opts);
  ASSERT_NE(e, nullptr);
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Future<Outputs>> all;
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t n = 0;
      while (!stop.load()) {
        const std::uint64_t id = std::uint64_t(t) * 1'000'000 + ++n;
        const int steps = 1 + static_cast<int>(n % 5);
        for (int k = 0; k < steps && !stop.load(); ++k) {
          auto f = e->submit(value(1), in_sequence(id, k == 0, k == steps - 1 && n % 3 != 0));
          if ((n + k) % 7 == 0) f.cancel();  // some cancelled, some sequences never ended
          std::lock_guard lock(mu);
          all.push_back(std::move(f));
        }
      }
    });
  }
  std::this_thread::sleep_for(300ms);
  e->shutdown(ShutdownMode::cancel, 0ms);
  stop = true;
  for (auto& t : threads) t.join();
  for (auto& f : all) (void)get_within(f, 5s);  // every accepted request ends
  const EngineMetrics m = e->metrics();
  EXPECT_EQ(m.submitted, m.completed + m.failed + m.timed_out + m.cancelled + m.shut_down);
  EXPECT_EQ(m.queue_depth, 0);
  EXPECT_GT(m.completed, 0u);
}

TEST(Sequences, ErrorsNameTheModelItselfWhenNoNameIsGiven) {
  SequenceBatchingOptions s = sequences();
  s.model_name.clear();
  auto e = make(std::make_shared<Accumulator>(), 1, s);
  ASSERT_NE(e, nullptr);
  auto r = e->try_submit(value(1), in_sequence(std::uint64_t(3), false, false));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("to model 'accumulator'"), std::string::npos)
      << r.status();
}

TEST(Sequences, AModelWithoutTheControlsInputIsRefusedAtCreate) {
  SequenceBatchingOptions s = sequences();
  s.controls.push_back({SequenceControl::Kind::end, "NOPE", DType::i32, 0, 1});
  EngineOptions o;
  o.workers = 1;
  o.sequence_batching = s;
  auto e = Engine::create(std::make_shared<Accumulator>(), *open_device("cpu"), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("'NOPE'"), std::string::npos);
}

}  // namespace
}  // namespace asyncinfer
