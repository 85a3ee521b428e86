// The python backend: a Triton model.py, each instance in its own Python process
// (python_process.hpp). URI "python:<path to model.py>" or a path ending in "model.py"; the
// signature comes from ModelOptions (the server passes config.pbtxt's input, output and
// max_batch_size (as batched and batch_limit), and the config itself as JSON for
// args["model_config"], whose model_transaction_policy says whether the model is decoupled).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <system_error>
#include <thread>

#include "asyncinfer/log.hpp"
#include "model/backend.hpp"
#include "model/config_types.hpp"
#include "model/model_host.hpp"
#include "model/python/python_process.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawn's environment

namespace asyncinfer::detail {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::string_view kDefaultInterpreter = "/usr/bin/python3";

// The config as Triton's model-configuration JSON, for a model loaded without a config.pbtxt.
std::string minimal_config(const std::string& name, const ModelSignature& sig) {
  auto list = [&](const std::vector<TensorSpec>& specs) {
    json out = json::array();
    for (const TensorSpec& s : specs) {
      json dims = json::array();
      for (std::size_t d = sig.batched ? 1 : 0; d < s.shape.size(); ++d) dims.push_back(s.shape[d]);
      out.push_back({{"name", s.name}, {"data_type", config_type(s.dtype)}, {"dims", dims}});
    }
    return out;
  };
  json c = {{"name", name},
            {"backend", "python"},
            // Triton's max_batch_size: 0 = no batch dim (and, here, a batched model without a
            // batch limit of its own).
            {"max_batch_size", sig.batched ? sig.batch_limit.value_or(0) : 0},
            {"input", list(sig.inputs)},
            {"output", list(sig.outputs)},
            {"model_transaction_policy", {{"decoupled", sig.decoupled}}}};
  return c.dump();
}

// Runs argv (no shell) and waits; the exit status, or -1 when it cannot start.
int run_command(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Unpacks an environment tarball (conda-pack's, or any tar of a Python environment) once into a
// cache folder named by its path, size and time, and returns that folder. Several loads at once
// unpack into folders of their own; the first rename wins.
Result<fs::path> unpacked_environment(const fs::path& tarball) {
  std::error_code ec;
  const auto size = fs::file_size(tarball, ec);
  const auto time = fs::last_write_time(tarball, ec).time_since_epoch().count();
  if (ec) return not_found_error("EXECUTION_ENV_PATH: no file " + tarball.string());
  const std::size_t key = std::hash<std::string>{}(tarball.string() + "|" + std::to_string(size) +
                                                   "|" + std::to_string(time));
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const fs::path root = cache != nullptr && *cache != '\0'
                            ? fs::path(cache) / "asyncinfer" / "python-envs"
                            : fs::temp_directory_path() / "asyncinfer-python-envs";
  const fs::path dir = root / (tarball.stem().stem().string() + "-" + std::to_string(key));
  if (fs::is_directory(dir, ec)) return dir;
  fs::create_directories(root, ec);
  const fs::path partial = dir.string() + ".partial-" + std::to_string(::getpid()) + "-" +
                           std::to_string(reinterpret_cast<std::uintptr_t>(&ec));
  // Python's tarfile (the "tar" filter: no absolute paths, no links out of the folder), by the
  // server's own interpreter: no tar parser here.
  const int rc = run_command({std::string(kDefaultInterpreter), "-c",
                              "import sys, tarfile\n"
                              "with tarfile.open(sys.argv[1]) as t:\n"
                              "    try:\n        t.extractall(sys.argv[2], filter='tar')\n"
                              "    except TypeError:\n        t.extractall(sys.argv[2])\n",
                              tarball.string(), partial.string()});
  if (rc != 0) {
    fs::remove_all(partial, ec);
    return invalid_argument_error("EXECUTION_ENV_PATH: cannot unpack " + tarball.string() +
                                  " (a tar archive of a Python environment was expected)");
  }
  // conda-pack's tarballs fix their prefixes with the script they carry.
  if (fs::exists(partial / "bin" / "conda-unpack", ec)) {
    (void)run_command(
        {(partial / "bin" / "python3").string(), (partial / "bin" / "conda-unpack").string()});
  }
  fs::rename(partial, dir, ec);
  if (ec) fs::remove_all(partial, ec);  // another load unpacked it first
  return dir;
}

// The interpreter of a model: Triton's EXECUTION_ENV_PATH parameter (a Python environment: a
// folder with bin/python3, or a tarball of one, "$$TRITON_MODEL_DIRECTORY" standing for the
// model's folder), or asyncinfer's python_interpreter, or Debian's python3. Other keys are
// model.py's own: it reads them from args["model_config"]["parameters"].
Status resolve_interpreter(PythonSetup& setup, const ModelOptions& options) {
  setup.interpreter = std::string(kDefaultInterpreter);
  for (const auto& [key, value] : options.backend_parameters) {
    if (key == "python_interpreter") setup.interpreter = value;
    if (key != "EXECUTION_ENV_PATH") continue;
    std::string path = value;
    constexpr std::string_view kModelDir = "$$TRITON_MODEL_DIRECTORY";
    for (std::size_t at = path.find(kModelDir); at != std::string::npos;
         at = path.find(kModelDir)) {
      path.replace(at, kModelDir.size(), setup.model_repository);
    }
    std::error_code ec;
    fs::path env = path;
    if (!fs::is_directory(env, ec)) {
      if (!fs::is_regular_file(env, ec)) {
        return not_found_error("python model '" + setup.model_name + "': EXECUTION_ENV_PATH " +
                               path +
                               " is neither a folder nor a file (a Python environment, or a "
                               "tarball of one, was expected)");
      }
      ASYNCINFER_ASSIGN_OR_RETURN(env, unpacked_environment(env));
    }
    const fs::path python = env / "bin" / "python3";
    if (!fs::exists(python, ec)) {
      return invalid_argument_error("python model '" + setup.model_name + "': EXECUTION_ENV_PATH " +
                                    path + " has no bin/python3");
    }
    setup.interpreter = python.string();
  }
  return Status();
}

// What every instance of the model at `file` (<repository>/<model>/<version>/model.py, as Triton
// lays a repository out) shares, but its signature, config and host.
Result<std::shared_ptr<PythonSetup>> make_setup(std::string_view uri, const fs::path& file,
                                                const ModelOptions& options) {
  auto setup = std::make_shared<PythonSetup>();
  setup->uri = std::string(uri);
  setup->model_py = file.string();
  const fs::path version_dir = file.parent_path();
  setup->model_version = version_dir.filename().string();
  setup->model_repository = version_dir.parent_path().string();
  setup->model_name = version_dir.parent_path().filename().string();
  ASYNCINFER_RETURN_IF_ERROR(resolve_interpreter(*setup, options));
  return setup;
}

// A batch's place in its instance's order: whether it was sent to the process ahead of its
// execute (Slot::send_ahead), to which process, in which slot. Guarded by its Slot's mutex.
struct Ticket {
  std::shared_ptr<const BatchIO> io;
  bool sent = false;
  std::uint64_t generation = 0;  // Slot::generation of the process it was sent to
  int slot = 0;
};

// The process of one instance, shared with the host functions of its batches (which may still
// run when the instance is destroyed).
//
// Batches in flight (PythonSetup::pipelined; the engine launches up to kPipelinedBatches on the
// stream): the worker's thread sends a batch to the process as it launches it (launch), and the
// stream's thread sends the next one as soon as a batch's outputs are read out (run), while the
// stream's thread holds the conversation of the batch before; so the process goes from one
// execute() to the next without waiting for this side. Batches reach the process in launch
// order, which is the order their executes run: a batch is sent ahead only behind batches all
// sent to the same process, and at most two sent ones are unfinished, in the two slots (input
// and output arenas), which alternate: a slot is reused only after the execute of its previous
// batch has returned. A batch sent to a process that has since been replaced is sent again by
// its own run, before any later one.
struct Slot {
  static constexpr int kPipelinedBatches = 3;  // two sent, and the next ready to go

  std::shared_ptr<const PythonSetup> setup;
  std::string instance_name;
  std::mutex mu;  // guards what follows, the tickets, and every sending of an execute
  std::unique_ptr<PythonProcess> process;
  std::uint64_t generation = 0;  // counts the processes started after the first
  int next_slot = 0;             // the slot of the next batch sent
  bool poisoned = false;         // a batch was sent and will not run: the process is replaced
  std::deque<std::shared_ptr<Ticket>> unfinished;  // launched, their execute not returned
  // A restart (ready()): in progress, and what it gave until a batch takes it.
  bool starting = false;
  std::optional<Result<std::unique_ptr<PythonProcess>>> started;
  std::condition_variable started_cv;
  // Last: destroyed first, so that a restart still running is stopped (its process killed) and
  // joined while what it writes to lives.
  std::jthread starter;

  // How its log lines and errors begin: "python model 'M' instance M_0_K".
  std::string who() const {
    return "python model '" + setup->model_name + "' instance " + instance_name;
  }

  // The worker's thread, as it launches the batch.
  std::shared_ptr<Ticket> launch(std::shared_ptr<const BatchIO> io) {
    auto ticket = std::make_shared<Ticket>();
    ticket->io = std::move(io);
    std::lock_guard lock(mu);
    unfinished.push_back(ticket);
    send_ahead();
    return ticket;
  }

  // A launched batch that will not run (its stream refused it): a batch sent ahead would be
  // answered to the next one's execute, so the process is replaced at the next batch.
  void abandon(const std::shared_ptr<Ticket>& ticket) {
    std::lock_guard lock(mu);
    if (ticket->sent) poisoned = true;
    std::erase(unfinished, ticket);
  }

  // The stream's thread.
  Status run(BatchIO& io, const std::stop_token& stop, const std::shared_ptr<Ticket>& ticket) {
    PythonProcess* p = nullptr;
    bool posted = false;
    int slot = 0;  // unless pipelined, execute sends the batch itself, in slot 0
    {
      std::unique_lock lock(mu);
      Status s = ready(lock, stop);
      if (!s.ok()) {
        std::erase(unfinished, ticket);
        return s;
      }
      posted = ticket->sent && ticket->generation == generation;
      if (!posted && setup->pipelined) {
        // Sent to a process since replaced (or not at all): sent now. No batch is at the process
        // (the earlier ones have ended; no later one is sent before this one).
        s = post(*ticket);
        if (!s.ok()) {
          // A send that failed leaves the process unusable: replaced at the next batch, which
          // learns how it ended. A batch refused before anything was sent (its input arena
          // could not grow) leaves it as it was.
          if (s.code() == StatusCode::unavailable) poisoned = true;
          std::erase(unfinished, ticket);
          send_ahead();
          return s;
        }
        posted = true;
      }
      if (posted) slot = ticket->slot;
      p = process.get();
    }
    // The process is replaced only by this thread (ready, under the lock): `p` stays valid.
    Status s = p->execute(io, stop, slot, posted);
    std::lock_guard lock(mu);
    std::erase(unfinished, ticket);
    send_ahead();  // this batch's slot is free: the next batch goes before this one's responses
    return s;
  }

 private:
  // Under mu: sends the launched batches not sent yet, in order, while fewer than two sent ones
  // are unfinished, behind batches all sent to the current process.
  void send_ahead() {
    if (!setup->pipelined || poisoned || !process || !process->alive()) return;
    int sent = 0;
    for (const auto& u : unfinished) {
      if (u->sent && u->generation == generation) {
        ++sent;
        continue;
      }
      // One sent to a replaced process is sent again by its run, before any later one.
      if (u->sent || sent >= 2 || !post(*u).ok()) return;
      ++sent;
    }
  }

  // Under mu: sends a ticket's batch to the current process in the next slot, and marks it so.
  Status post(Ticket& t) {
    ASYNCINFER_RETURN_IF_ERROR(process->post(*t.io, next_slot));
    t.sent = true;
    t.generation = generation;
    t.slot = next_slot;
    next_slot ^= 1;
    return Status();
  }

  // Under mu (`lock`): a running process, restarted (initialize again) when the last one ended.
  // The restart runs on a thread of its own (starter), not bounded by the batch that asked for
  // it: a batch whose requests end meanwhile (their timeout shorter than initialize) stops
  // waiting, and the next batch takes the process once it is up, instead of every batch
  // starting one that the next timeout kills. The wait releases mu, so that batches are still
  // launched meanwhile. Only the instance's end (the Slot's destruction) stops a restart.
  Status ready(std::unique_lock<std::mutex>& lock, const std::stop_token& stop) {
    for (bool waited = false;;) {
      if (process && process->alive() && !poisoned && !process->exited()) return Status();
      if (started) {
        // A restart that no batch waited for to its end: its process is taken (and checked
        // again above: it may have died since); its failure is old news, and a new restart
        // is tried (the model may start now).
        Result<std::unique_ptr<PythonProcess>> p = std::move(*started);
        started.reset();
        if (p.ok()) {
          adopt(std::move(*p));
          continue;
        }
      }
      if (waited) {
        return unavailable_error(who() + ": its restarted process ended before its first batch");
      }
      if (!starting) {
        Status s = begin_restart();
        if (!s.ok()) return s;
      }
      // The batch's end wakes the wait. Its callback takes mu (no lost notification), so the
      // callback is made and destroyed without mu held: either may wait for the other.
      lock.unlock();
      {
        std::stop_callback wake(stop, [this] {
          std::lock_guard l(mu);
          started_cv.notify_all();
        });
        lock.lock();
        started_cv.wait(lock, [&] { return !starting || stop.stop_requested(); });
        lock.unlock();
      }
      lock.lock();
      if (starting || !started) {
        return cancelled_error(who() +
                               ": the batch ended while its process restarted; the restart goes "
                               "on for the next batch");
      }
      Result<std::unique_ptr<PythonProcess>> p = std::move(*started);
      started.reset();
      if (!p.ok()) {
        return Status(p.status().code(),
                      "restarting the instance failed: " + std::string(p.status().message()));
      }
      adopt(std::move(*p));
      waited = true;  // checked above; if it has died already, this batch fails
    }
  }

  // Under mu: the process replaced by a new one, started on the starter thread.
  Status begin_restart() {
    // It crashed, hung or was stopped during an earlier batch, or died (killed) since: a new
    // process, initialize again.
    if (process && process->alive() && !poisoned) {
      log(LogLevel::warning, who() + ": its process ended between batches");
    }
    process.reset();
    poisoned = false;
    ++generation;  // what was sent to the old one is sent again
    next_slot = 0;
    if (starter.joinable()) starter.join();  // the one before has ended (`starting` was false)
    try {
      starter = std::jthread([this](std::stop_token until) {
        Result<std::unique_ptr<PythonProcess>> p =
            PythonProcess::start(setup, instance_name, &until);
        std::lock_guard done(mu);
        started.emplace(std::move(p));
        starting = false;
        started_cv.notify_all();
      });
    } catch (const std::system_error& e) {
      return internal_error(who() + ": no thread to restart its process: " + e.what());
    }
    starting = true;  // under mu still: the thread sets it back only once it has mu
    return Status();
  }

  // Under mu: a process a restart gave becomes the instance's.
  void adopt(std::unique_ptr<PythonProcess> p) {
    process = std::move(p);
    log(LogLevel::warning, who() + ": restarted (pid " + std::to_string(process->pid()) + ")");
  }
};

class PythonInstance final : public ModelInstance {
 public:
  explicit PythonInstance(std::shared_ptr<Slot> slot) : slot_(std::move(slot)) {}

  Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
    // Filled by the host function (decoupled: left empty, the final flag).
    io->outputs.clear();
    io->request_outputs.clear();
    Kernel k;
    k.name = "model.py";  // errors name the model and instance themselves
    k.stop = io->stop;
    std::shared_ptr<Ticket> ticket = slot_->launch(io);
    k.host_fn = [slot = slot_, io, ticket](std::stop_token stop) -> Status {
      return slot->run(*io, stop, ticket);
    };
    Status s = stream.enqueue(std::move(k));
    if (!s.ok()) slot_->abandon(ticket);
    return s;
  }

 private:
  std::shared_ptr<Slot> slot_;
};

class PythonModel final : public Model {
 public:
  static constexpr int kCoalescedRequests = 16;

  explicit PythonModel(std::shared_ptr<const PythonSetup> setup) : setup_(std::move(setup)) {}

  const ModelSignature& signature() const noexcept override { return setup_->signature; }
  const std::string& name() const noexcept override { return setup_->uri; }
  // model.py learns of the end of its requests through is_cancelled(); one that ignores it is
  // stopped after PythonSetup::stop_grace.
  bool cancellable() const noexcept override { return true; }
  bool uses_host_cores(const Device& /*device*/) const noexcept override { return true; }
  // execute(requests) gets each request's own tensors, as Triton's python backend gives them:
  // requests of different shapes may share a batch (sequence batching does not match them).
  bool takes_requests_apart() const noexcept override { return true; }
  int pipelined_batches() const noexcept override {
    return setup_->pipelined ? Slot::kPipelinedBatches : 0;
  }
  // Where the engine does not batch (no dynamic_batching: Triton gives execute() one request at
  // a time), the requests queued together go to the process in one message, and the stub calls
  // execute() once for each (BatchIO::coalesced). Not for decoupled or stateful models.
  int coalesced_requests() const noexcept override {
    return setup_->pipelined ? kCoalescedRequests : 0;
  }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device& device, Stream& /*stream*/,
                                                         const InstanceOptions& options) override {
    // Its instances are host processes that decide their outputs' shapes while the batch runs:
    // the outputs are allocated then, which only a device whose memory is the host's allows.
    if (!device.info().unified_memory) {
      return unavailable_error("python model '" + setup_->model_name +
                               "': runs on a device whose memory is the host's (unified memory: "
                               "cpu), since its instances are host processes that allocate their "
                               "outputs while the batch runs; not on " +
                               device.name());
    }
    auto slot = std::make_shared<Slot>();
    slot->setup = setup_;
    // Triton's instance names: <model>_<group>_<index>.
    slot->instance_name = setup_->model_name + "_0_" + std::to_string(options.worker_index);
    // A caller that can abandon the creation (a model server's load, with its own deadline)
    // bounds initialize() itself.
    const bool bounded = options.stop.stop_possible();
    ASYNCINFER_ASSIGN_OR_RETURN(
        slot->process, PythonProcess::start(setup_, slot->instance_name, &options.stop, bounded));
    return std::unique_ptr<ModelInstance>(std::make_unique<PythonInstance>(std::move(slot)));
  }

 private:
  std::shared_ptr<const PythonSetup> setup_;
};

}  // namespace

Result<std::shared_ptr<Model>> load_python_model(std::string_view uri, std::string_view path,
                                                 const ModelOptions& options) {
  std::error_code ec;
  const fs::path file = fs::absolute(fs::path(path), ec);
  if (ec || !fs::is_regular_file(file, ec)) {
    return not_found_error("python model: no file " + std::string(path));
  }
  if (options.inputs.empty() || options.outputs.empty()) {
    return invalid_argument_error(
        "python model " + file.string() +
        ": its inputs and outputs must be given (config.pbtxt input and output, with name, "
        "data_type and dims, or model.py's auto_complete_config adding them)");
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<PythonSetup> setup, make_setup(uri, file, options));
  setup->host = options.host;
  ModelSignature& sig = setup->signature;
  sig.inputs = options.inputs;
  sig.outputs = options.outputs;
  sig.batched = options.batched.value_or(options.batch_limit.has_value());
  sig.batch_limit = sig.batched ? options.batch_limit : std::nullopt;
  bool one_at_a_time = false;
  if (!options.model_config_json.empty()) {
    // Decoupled or not: the config's model_transaction_policy, as model.py reads it too.
    const json config = json::parse(options.model_config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return invalid_argument_error("python model " + file.string() +
                                    ": its model_config_json is not a JSON object");
    }
    const auto policy = config.find("model_transaction_policy");
    if (policy != config.end() && policy->is_object()) {
      const auto decoupled = policy->find("decoupled");
      if (decoupled != policy->end() && decoupled->is_boolean()) {
        sig.decoupled = decoupled->get<bool>();
      }
    }
    // A sequence's next batch may need this one's state (implicit state): one at a time. With
    // dynamic batching, the requests that come while a batch runs make the next one: a batch
    // sent ahead would be smaller (the numpy MLP of bench/compare_triton.py lost 4-16 % so).
    one_at_a_time = config.contains("sequence_batching") || config.contains("dynamic_batching");
  }
  setup->pipelined = !sig.decoupled && !one_at_a_time;
  for (const auto* list : {&sig.inputs, &sig.outputs}) {
    for (const TensorSpec& s : *list) {
      if (sig.batched && (s.shape.empty() || s.shape[0] != -1)) {
        return invalid_argument_error("python model " + file.string() + ": tensor '" + s.name +
                                      "' needs a dynamic batch dim 0 (the model is batched)");
      }
    }
  }
  setup->config_json = options.model_config_json.empty() ? minimal_config(setup->model_name, sig)
                                                         : options.model_config_json;
  return std::shared_ptr<Model>(std::make_shared<PythonModel>(std::move(setup)));
}

// complete_model_config for model.py: its auto_complete_config, run unless the file defines
// its TritonPythonModel itself with no auto_complete_config (a process, numpy and model.py's
// imports cost a fraction of a second per load). A model.py whose class comes from an import
// (`from python_addsub import *`, as Triton's qa models do) is run: only Python can tell.
Result<std::string> complete_python_config(std::string_view uri, std::string_view path,
                                           std::string_view config_json,
                                           const ModelOptions& options) {
  std::error_code ec;
  const fs::path file = fs::absolute(fs::path(path), ec);
  std::ifstream in(file);
  if (!in) return not_found_error("python model: no file " + std::string(path));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.find("auto_complete_config") == std::string::npos &&
      text.find("class TritonPythonModel") != std::string::npos) {
    return std::string(config_json);
  }
  ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<PythonSetup> setup, make_setup(uri, file, options));
  return PythonProcess::auto_complete(std::move(setup), std::string(config_json));
}

void register_python_model_backend(ModelBackendRegistry& registry) {
  (void)registry.add({"python", "python:<model.py> or a path ending in model.py",
                      &load_python_model, &complete_python_config,
                      /*takes_backend_parameters=*/true});
}

}  // namespace asyncinfer::detail
