// Sequences for stateful models (sequence_batcher.hpp).
#include "engine/sequence_batcher.hpp"

#include <algorithm>
#include <cstring>

#include "asyncinfer/detail/chrono.hpp"

namespace asyncinfer {

std::string to_string(const CorrelationId& id) {
  if (const auto* n = std::get_if<std::uint64_t>(&id)) return std::to_string(*n);
  return std::get<std::string>(id);
}

}  // namespace asyncinfer

namespace asyncinfer::detail {

namespace {

const char* kind_name(SequenceControl::Kind k) {
  switch (k) {
    case SequenceControl::Kind::start:
      return "CONTROL_SEQUENCE_START";
    case SequenceControl::Kind::end:
      return "CONTROL_SEQUENCE_END";
    case SequenceControl::Kind::ready:
      return "CONTROL_SEQUENCE_READY";
    case SequenceControl::Kind::corrid:
      return "CONTROL_SEQUENCE_CORRID";
  }
  return "?";
}

bool is_integer_id_type(DType t) {
  return t == DType::u64 || t == DType::i64 || t == DType::u32 || t == DType::i32;
}

/// One element of `dtype` holding `v`, in a tensor of one row.
Result<Tensor> scalar(DType dtype, double v, bool batched) {
  Shape shape = batched ? Shape{1, 1} : Shape{1};
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(dtype, shape));
  void* p = t.data();
  switch (dtype) {
    case DType::i32: {
      const auto x = static_cast<std::int32_t>(v);
      std::memcpy(p, &x, sizeof x);
      break;
    }
    case DType::f32: {
      const auto x = static_cast<float>(v);
      std::memcpy(p, &x, sizeof x);
      break;
    }
    case DType::boolean: {
      const std::uint8_t x = v != 0 ? 1 : 0;
      std::memcpy(p, &x, sizeof x);
      break;
    }
    default:
      return internal_error("sequence control of dtype " + std::string(to_string(dtype)));
  }
  return t;
}

Result<Tensor> corrid_tensor(DType dtype, const CorrelationId& id, bool batched) {
  Shape shape = batched ? Shape{1, 1} : Shape{1};
  if (dtype == DType::bytes) {
    const std::string text = to_string(id);
    return Tensor::from_strings(shape, std::span<const std::string>(&text, 1));
  }
  const auto* n = std::get_if<std::uint64_t>(&id);
  if (n == nullptr) return invalid_argument_error("a string correlation ID for an integer CORRID");
  ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(dtype, shape));
  switch (dtype) {
    case DType::u64:
    case DType::i64:
      std::memcpy(t.data(), n, 8);
      break;
    case DType::u32:
    case DType::i32: {
      const auto x = static_cast<std::uint32_t>(*n);
      std::memcpy(t.data(), &x, 4);
      break;
    }
    default:
      return internal_error("CORRID of dtype " + std::string(to_string(dtype)));
  }
  return t;
}

}  // namespace

// ---- SequencePlan -------------------------------------------------------------------------------

Result<SequencePlan> SequencePlan::make(const SequenceBatchingOptions& o,
                                        const ModelSignature& sig) {
  auto bad = [](const std::string& m) {
    return invalid_argument_error("EngineOptions: sequence_batching: " + m);
  };
  SequencePlan p;
  p.controls = o.controls;
  p.states = o.states;
  p.batched = sig.batched;
  p.model_name = o.model_name;
  p.input_source.assign(sig.inputs.size(), 0);
  p.output_state.assign(sig.outputs.size(), -1);
  std::vector<bool> taken(sig.inputs.size(), false);
  const auto find_input = [&](const std::string& name, const std::string& what) -> Result<int> {
    for (std::size_t i = 0; i < sig.inputs.size(); ++i) {
      if (sig.inputs[i].name != name) continue;
      if (taken[i]) return bad("input '" + name + "' is filled twice (" + what + ")");
      taken[i] = true;
      return static_cast<int>(i);
    }
    return bad(what + " names input '" + name + "', which the model does not have");
  };
  const int nc = static_cast<int>(o.controls.size());
  for (int k = 0; k < nc; ++k) {
    const SequenceControl& c = o.controls[static_cast<std::size_t>(k)];
    const std::string what = std::string(kind_name(c.kind)) + " control";
    ASYNCINFER_ASSIGN_OR_RETURN(int i, find_input(c.input, what));
    const DType want = sig.inputs[static_cast<std::size_t>(i)].dtype;
    const bool ok =
        c.kind == SequenceControl::Kind::corrid
            ? (is_integer_id_type(c.dtype) || c.dtype == DType::bytes)
            : (c.dtype == DType::i32 || c.dtype == DType::f32 || c.dtype == DType::boolean);
    if (!ok) {
      return bad(what + " '" + c.input + "' has dtype " + std::string(to_string(c.dtype)) +
                 "; expected " +
                 (c.kind == SequenceControl::Kind::corrid ? "u64, i64, u32, i32 or bytes"
                                                          : "i32, f32 or bool"));
    }
    if (want != c.dtype) {
      return bad(what + " '" + c.input + "' is " + std::string(to_string(c.dtype)) +
                 " but the model's input is " + std::string(to_string(want)));
    }
    p.input_source[static_cast<std::size_t>(i)] = -1 - k;
  }
  for (std::size_t k = 0; k < o.states.size(); ++k) {
    const SequenceState& s = o.states[k];
    const std::string what = "state '" + s.input + "'";
    if (s.dtype == DType::bytes) return bad(what + ": a state of bytes is not supported");
    ASYNCINFER_ASSIGN_OR_RETURN(int i, find_input(s.input, what));
    const TensorSpec& in = sig.inputs[static_cast<std::size_t>(i)];
    if (in.dtype != s.dtype) {
      return bad(what + " is " + std::string(to_string(s.dtype)) + " but the model's input is " +
                 std::string(to_string(in.dtype)));
    }
    p.input_source[static_cast<std::size_t>(i)] = -1 - nc - static_cast<int>(k);
    auto out = std::find_if(sig.outputs.begin(), sig.outputs.end(),
                            [&](const TensorSpec& t) { return t.name == s.output; });
    if (out == sig.outputs.end()) {
      return bad(what + " names output '" + s.output + "', which the model does not have");
    }
    if (out->dtype != s.dtype) {
      return bad(what + ": output '" + s.output + "' is " + std::string(to_string(out->dtype)) +
                 ", not " + std::string(to_string(s.dtype)));
    }
    std::size_t oi = static_cast<std::size_t>(out - sig.outputs.begin());
    if (p.output_state[oi] >= 0) return bad("output '" + s.output + "' keeps two states");
    p.output_state[oi] = static_cast<int>(k);
    for (std::int64_t d : s.dims) {
      if (d < 0) return bad(what + " has a dynamic dim; state dims must be fixed");
    }
    Shape row = s.dims;
    if (sig.batched) row.insert(row.begin(), 1);
    Tensor first;
    if (s.initial) {
      if (s.initial->dtype() != s.dtype || s.initial->shape() != s.dims) {
        return bad(what + ": its initial value is " + std::string(to_string(s.initial->dtype())) +
                   shape_to_string(s.initial->shape()) + ", expected " +
                   std::string(to_string(s.dtype)) + shape_to_string(s.dims));
      }
      ASYNCINFER_ASSIGN_OR_RETURN(first, s.initial->clone());
      ASYNCINFER_ASSIGN_OR_RETURN(first, first.reshape(row));
    } else {
      ASYNCINFER_ASSIGN_OR_RETURN(first, Tensor::zeros(s.dtype, row));
    }
    p.initial.push_back(std::move(first));
  }
  p.request_signature = sig;
  p.request_signature.inputs.clear();
  p.request_signature.outputs.clear();
  int user = 0;
  for (std::size_t i = 0; i < sig.inputs.size(); ++i) {
    if (taken[i]) continue;
    p.input_source[i] = user++;
    p.request_signature.inputs.push_back(sig.inputs[i]);
  }
  for (std::size_t i = 0; i < sig.outputs.size(); ++i) {
    if (p.output_state[i] < 0) p.request_signature.outputs.push_back(sig.outputs[i]);
  }
  return p;
}

Result<Inputs> SequencePlan::model_inputs(const Request& r) const {
  const SequenceFlags& f = *r.sequence_flags;
  const Sequence& seq = *r.sequence;
  Inputs in;
  in.reserve(input_source.size());
  const int nc = static_cast<int>(controls.size());
  for (int src : input_source) {
    if (src >= 0) {
      in.push_back(r.inputs[static_cast<std::size_t>(src)]);
      continue;
    }
    const int k = -1 - src;
    if (k < nc) {
      const SequenceControl& c = controls[static_cast<std::size_t>(k)];
      Result<Tensor> t = internal_error("unset");
      switch (c.kind) {
        case SequenceControl::Kind::start:
          t = scalar(c.dtype, f.start ? c.true_value : c.false_value, batched);
          break;
        case SequenceControl::Kind::end:
          t = scalar(c.dtype, f.end ? c.true_value : c.false_value, batched);
          break;
        case SequenceControl::Kind::ready:
          t = scalar(c.dtype, c.true_value, batched);
          break;
        case SequenceControl::Kind::corrid:
          t = corrid_tensor(c.dtype, f.id, batched);
          break;
      }
      if (!t.ok()) return t.status();
      in.push_back(std::move(*t));
      continue;
    }
    const auto s = static_cast<std::size_t>(k - nc);
    const bool fresh = f.start || s >= seq.state.size() || !seq.state[s].defined();
    in.push_back(fresh ? initial[s] : seq.state[s]);
  }
  return in;
}

void SequencePlan::keep_state(Request& r, Outputs& outs) const {
  if (states.empty()) return;
  Sequence& seq = *r.sequence;
  seq.state.resize(states.size());
  Outputs mine;
  mine.reserve(outs.size());
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const int k = i < output_state.size() ? output_state[i] : -1;
    if (k >= 0) {
      seq.state[static_cast<std::size_t>(k)] = std::move(outs[i]);
    } else {
      mine.push_back(std::move(outs[i]));
    }
  }
  outs = std::move(mine);
}

// ---- SequenceTable ------------------------------------------------------------------------------

SequenceTable::SequenceTable(const SequenceBatchingOptions& o, int workers, std::int64_t max_rows)
    : opt_(o) {
  const int per = o.slots_per_worker > 0 ? o.slots_per_worker
                                         : static_cast<int>(std::max<std::int64_t>(1, max_rows));
  slots_.assign(static_cast<std::size_t>(std::max(workers, 1)),
                std::vector<std::shared_ptr<Sequence>>(static_cast<std::size_t>(per)));
  next_slot_.assign(slots_.size(), 0);
}

Status SequenceTable::backlog_expired() {
  return unavailable_error("timeout of the corresponding sequence has been expired");
}

std::optional<Status> SequenceTable::add(const std::shared_ptr<Request>& r, Clock::time_point now) {
  const SequenceFlags& f = *r->sequence_flags;
  auto it = by_id_.find(f.id);
  if (it == by_id_.end() && !f.start) {
    return invalid_argument_error("inference request for sequence " + to_string(f.id) +
                                  " to model '" + opt_.model_name +
                                  "' must specify the START flag on the first request of the "
                                  "sequence");
  }
  std::shared_ptr<Sequence> s;
  if (it != by_id_.end()) {
    // A START on a live ID continues in its slot (Triton: the previous sequence did not end;
    // its requests run first, then this one starts the state afresh).
    s = it->second;
  } else {
    s = std::make_shared<Sequence>();
    s->id = f.id;
    ++live_;
    // The free slot of the worker with the fewest sequences, lowest index first.
    int best_w = -1;
    int best_slot = -1;
    std::size_t best_used = 0;
    for (std::size_t w = 0; w < slots_.size(); ++w) {
      std::size_t used = 0;
      int free_slot = -1;
      for (std::size_t k = 0; k < slots_[w].size(); ++k) {
        if (slots_[w][k]) {
          ++used;
        } else if (free_slot < 0) {
          free_slot = static_cast<int>(k);
        }
      }
      if (free_slot >= 0 && (best_w < 0 || used < best_used)) {
        best_w = static_cast<int>(w);
        best_slot = free_slot;
        best_used = used;
      }
    }
    if (best_w >= 0) {
      bind(s, best_w, best_slot);
    } else {
      s->backlogged = true;
      backlog_.push_back(s);
    }
    by_id_.emplace(f.id, s);
  }
  r->sequence = s;
  s->pending.push_back(r);
  ++queued_;
  s->last_request = now;
  if (f.end) {
    // Triton forgets the ID when its END is accepted: a later request needs a new START.
    s->closed = true;
    forget(*s);
  }
  return std::nullopt;
}

void SequenceTable::bind(const std::shared_ptr<Sequence>& s, int worker, int slot) {
  slots_[static_cast<std::size_t>(worker)][static_cast<std::size_t>(slot)] = s;
  s->worker = worker;
  s->slot = slot;
  s->backlogged = false;
}

void SequenceTable::forget(const Sequence& s) {
  auto it = by_id_.find(s.id);
  if (it != by_id_.end() && it->second.get() == &s) by_id_.erase(it);
}

void SequenceTable::release(Sequence& s) {
  if (s.released) return;
  s.released = true;
  --live_;
  forget(s);
  if (s.backlogged) {
    auto it = std::find_if(backlog_.begin(), backlog_.end(),
                           [&](const std::shared_ptr<Sequence>& b) { return b.get() == &s; });
    if (it != backlog_.end()) backlog_.erase(it);
    s.backlogged = false;
    return;
  }
  if (s.worker < 0) return;
  const int w = s.worker;
  const int k = s.slot;
  slots_[static_cast<std::size_t>(w)][static_cast<std::size_t>(k)].reset();
  s.worker = -1;
  s.slot = -1;
  s.state.clear();
  if (!backlog_.empty()) {
    std::shared_ptr<Sequence> next = std::move(backlog_.front());
    backlog_.pop_front();
    bind(next, w, k);
  }
}

void SequenceTable::release_if_over(Sequence& s) {
  if (s.closed && !s.running && s.pending.empty()) release(s);
}

std::vector<std::shared_ptr<Request>> SequenceTable::take(int worker, std::int64_t max_rows,
                                                          Clock::time_point now,
                                                          Clock::time_point& wake) {
  std::vector<std::shared_ptr<Request>> out;
  wake = Clock::time_point::max();
  const auto idle = saturating_cast<Clock::duration>(opt_.max_sequence_idle);
  // Idle slots of every worker: the workers are the reaper (whichever looks first frees them).
  for (auto& row : slots_) {
    for (auto& held : row) {
      if (!held || held->running || !held->pending.empty()) continue;
      const Clock::time_point expiry = saturating_add(held->last_request, idle);
      if (expiry <= now) {
        ++idle_released_;
        std::shared_ptr<Sequence> s = held;  // release() resets `held`
        release(*s);
      } else {
        wake = std::min(wake, expiry);
      }
    }
  }
  // From where the last batch stopped, round the slots: with more slots than a batch holds
  // (oldest, or a half-open breaker's probe of one row) no slot waits behind the others.
  auto& row = slots_[static_cast<std::size_t>(worker)];
  std::size_t& cursor = next_slot_[static_cast<std::size_t>(worker)];
  for (std::size_t n = 0; n < row.size(); ++n) {
    if (static_cast<std::int64_t>(out.size()) >= max_rows) break;
    const std::size_t k = (cursor + n) % row.size();
    auto& s = row[k];
    if (!s || s->running || s->pending.empty()) continue;
    s->running = true;
    out.push_back(std::move(s->pending.front()));
    s->pending.pop_front();
    --queued_;
    if (static_cast<std::int64_t>(out.size()) >= max_rows) cursor = (k + 1) % row.size();
  }
  return out;
}

bool SequenceTable::finished(const std::vector<SequenceRun>& runs, Clock::time_point now) {
  bool changed = false;
  for (const SequenceRun& run : runs) {
    Sequence& s = *run.sequence;
    s.running = false;
    s.last_request = std::max(s.last_request, now);  // idle counts from the last activity
    if (run.end && s.pending.empty()) {
      s.closed = true;
      release(s);
      changed = true;
    } else if (!s.pending.empty()) {
      changed = true;
    } else {
      release_if_over(s);
    }
  }
  return changed;
}

void SequenceTable::withdraw(Request& r, Stage to, std::vector<std::shared_ptr<Request>>* also) {
  const std::shared_ptr<Sequence> s = r.sequence;
  if (!s) return;
  auto it = std::find_if(s->pending.begin(), s->pending.end(),
                         [&](const std::shared_ptr<Request>& p) { return p.get() == &r; });
  if (it == s->pending.end()) return;
  s->pending.erase(it);
  --queued_;
  if (r.sequence_flags->end) s->closed = true;
  if (s->backlogged && to == Stage::timed_out && also != nullptr) {
    // Triton rejects the whole backlogged sequence when its timeout expires.
    ++backlog_expired_;
    for (auto& p : s->pending) also->push_back(std::move(p));
    queued_ -= static_cast<std::int64_t>(s->pending.size());
    s->pending.clear();
    s->closed = true;
  }
  // A backlogged sequence left with nothing waiting (its client cancelled what it sent) leaves
  // the backlog: the backlog stays bounded by the requests waiting, whatever clients do.
  if (s->backlogged && s->pending.empty()) s->closed = true;
  release_if_over(*s);
}

void SequenceTable::append_waiting(std::vector<std::shared_ptr<Request>>& out) const {
  for (const auto& row : slots_) {
    for (const auto& s : row) {
      if (s) out.insert(out.end(), s->pending.begin(), s->pending.end());
    }
  }
  for (const auto& s : backlog_) out.insert(out.end(), s->pending.begin(), s->pending.end());
}

SequenceTable::Counts SequenceTable::counts() const {
  return {live_, static_cast<std::int64_t>(backlog_.size()), idle_released_, backlog_expired_};
}

}  // namespace asyncinfer::detail
