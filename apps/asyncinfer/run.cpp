// run.cpp — `asyncinfer run`: an image-classification job over real files.
//
//   decode + resize + normalise (host threads) → inference (the engine, batched) → softmax, top-k
//
// --mode sync runs the three steps one image after another (the article's §1.1 synchronous
// loop); --mode async runs them as a three-stage Pipeline whose middle stage is the Engine, so
// decoding, inference and post-processing overlap and the engine forms batches. Both print the
// same summary (accuracy when labels are given, images/s, latency p50/p99), so they can be
// compared run against run; a file that cannot be read or decoded is reported by name and skipped.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "asyncinfer/asyncinfer.hpp"
#include "cli_options.hpp"
#include "commands.hpp"
#include "images.hpp"
#include "mode.hpp"
#include "stats.hpp"

namespace asyncinfer::cli {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct RunOptions {
  std::string model;
  BackendParameters backend_parameters;
  std::string device = "cpu";
  std::vector<std::string> images;
  std::string labels;
  int input_size = 0;
  std::optional<float> mean;
  std::optional<float> std_dev;
  int top_k = 1;
  Mode mode = Mode::async;
  int workers = 0;                  ///< 0 = the engine's rule (EngineOptions::workers)
  /// --max-batch-size; unset = the engine's rule (BatchingOptions::max_batch_size)
  std::optional<std::int64_t> max_batch_size;
  std::int64_t max_queue_delay_us = 0;
  int decode_threads = 0;
  std::size_t window = 64;
  std::string output;
  std::string summary;
  bool quiet = false;
  bool compare = false;
  int repeat = 1;
};

struct RunSummary {
  Mode mode = Mode::sync;
  int workers = 0;  ///< as the engine chose them
  std::size_t ok = 0;
  std::size_t skipped = 0;
  std::size_t labelled = 0;
  std::size_t correct = 0;
  double wall_s = 0;
  double throughput = 0;
  LatencySummary latency;
  double batch_mean = 0;
  double accuracy() const {
    return labelled > 0 ? static_cast<double>(correct) / static_cast<double>(labelled) : 0.0;
  }
};

struct Prediction {
  std::string file;
  int label = -1;                          // -1: unknown
  std::vector<std::pair<int, float>> top;  // (class, probability), best first
  double latency_us = 0;
  Status error;
};

/// Softmax over one row of logits, then the k best classes.
std::vector<std::pair<int, float>> top_k(const float* logits, std::size_t n, int k) {
  const float max = *std::max_element(logits, logits + n);
  std::vector<std::pair<int, float>> p(n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = std::exp(static_cast<double>(logits[i] - max));
    p[i] = {static_cast<int>(i), static_cast<float>(e)};
    sum += e;
  }
  for (auto& x : p) x.second = static_cast<float>(x.second / sum);
  const std::size_t kk = std::min<std::size_t>(static_cast<std::size_t>(k), n);
  std::partial_sort(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(kk), p.end(),
                    [](const auto& a, const auto& b) { return a.second > b.second; });
  p.resize(kk);
  return p;
}

/// Preprocessing from the model's sidecar ("<model>.json": preprocessing.input_size, mean, std;
/// labels) where present, the model's input shape [N, C, H, W], then the command line.
Result<Preprocess> preprocessing(const RunOptions& o, const ModelSignature& sig,
                                 std::vector<std::string>& class_names) {
  Preprocess p;
  const std::string sidecar = o.model + ".json";
  std::error_code ec;
  if (fs::exists(sidecar, ec)) {
    try {
      std::ifstream in(sidecar);
      const json j = json::parse(in);
      if (j.contains("preprocessing")) {
        const json& pp = j["preprocessing"];
        p.size = pp.value("input_size", p.size);
        p.mean = pp.value("mean", p.mean);
        p.std = pp.value("std", p.std);
        p.channels = pp.value("channels", p.channels);
      }
      if (j.contains("labels")) {
        for (const auto& l : j["labels"]) class_names.push_back(l.get<std::string>());
      }
    } catch (const std::exception& e) {
      return invalid_argument_error("model sidecar '" + sidecar + "': " + e.what());
    }
  }
  if (sig.inputs.size() != 1 || sig.inputs[0].shape.size() != 4) {
    return invalid_argument_error(
        "asyncinfer run needs a model with one input of shape "
        "[N, C, H, W]; this one has " +
        sig.to_string());
  }
  const Shape& s = sig.inputs[0].shape;
  if (s[1] > 0) p.channels = static_cast<int>(s[1]);
  if (s[2] > 0) p.size = static_cast<int>(s[2]);
  if (o.input_size > 0) p.size = o.input_size;
  if (o.mean) p.mean = *o.mean;
  if (o.std_dev) p.std = *o.std_dev;
  if (p.channels != 1 && p.channels != 3) {
    return invalid_argument_error("the model takes " + std::to_string(p.channels) +
                                  " channels; asyncinfer run handles 1 (gray) or 3 (RGB)");
  }
  if (sig.inputs[0].dtype != DType::f32) {
    return invalid_argument_error("asyncinfer run feeds f32 images; the model's input is " +
                                  std::string(to_string(sig.inputs[0].dtype)));
  }
  if (!(p.std > 0)) return invalid_argument_error("--std must be > 0");
  return p;
}

/// A progress line on stderr: redrawn in place on a terminal, a line every 2 s otherwise.
class Progress {
 public:
  Progress(std::size_t total, bool quiet) : total_(total), quiet_(quiet), tty_(isatty(2) != 0) {}
  void tick(std::size_t done) {
    if (quiet_) return;
    const auto now = Clock::now();
    const auto every = tty_ ? std::chrono::milliseconds(200) : std::chrono::milliseconds(2000);
    std::lock_guard lock(mu_);
    if (now - last_ < every && done != total_) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%s[run] %zu/%zu images, %.0f images/s%s", tty_ ? "\r" : "", done, total_,
                 s > 0 ? static_cast<double>(done) / s : 0.0, tty_ ? "" : "\n");
    if (tty_ && done == total_) std::fputc('\n', stderr);
  }

 private:
  std::size_t total_;
  bool quiet_;
  bool tty_;
  std::mutex mu_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
};

Status write_predictions(const std::string& path, const std::vector<Prediction>& preds,
                         const std::vector<std::string>& names) {
  auto name_of = [&](int c) {
    return c >= 0 && static_cast<std::size_t>(c) < names.size() ? names[static_cast<std::size_t>(c)]
                                                                : std::to_string(c);
  };
  std::ofstream out(path);
  if (!out) return invalid_argument_error("cannot write --output file '" + path + "'");
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".json") {
    json arr = json::array();
    for (const Prediction& p : preds) {
      json j{{"file", p.file}};
      if (p.label >= 0) j["label"] = name_of(p.label);
      if (!p.error.ok()) {
        j["error"] = p.error.to_string();
      } else {
        json top = json::array();
        for (auto [c, prob] : p.top) top.push_back({{"class", name_of(c)}, {"probability", prob}});
        j["top"] = top;
        j["latency_us"] = p.latency_us;
      }
      arr.push_back(j);
    }
    out << arr.dump(2) << "\n";
  } else {
    std::size_t k = 1;
    for (const Prediction& p : preds) k = std::max(k, p.top.size());
    out << "file,label";
    for (std::size_t i = 1; i <= k; ++i) out << ",prediction" << i << ",probability" << i;
    out << ",latency_us,error\n";
    for (const Prediction& p : preds) {
      out << p.file << "," << (p.label >= 0 ? name_of(p.label) : "");
      for (std::size_t i = 0; i < k; ++i) {
        if (p.error.ok() && i < p.top.size()) {
          out << "," << name_of(p.top[i].first) << "," << p.top[i].second;
        } else {
          out << ",,";
        }
      }
      if (p.error.ok()) {
        out << "," << p.latency_us << ",";
      } else {
        out << ",,\"" << p.error.to_string() << "\"";
      }
      out << "\n";
    }
  }
  return Status();
}

/// Files that failed are reported one by one up to this many, then counted.
constexpr std::size_t kMaxReported = 20;
/// Runs of at most this many images print each image's top-k.
constexpr std::size_t kPrintPredictions = 20;

/// One run in `mode`; fills `result`. Returns an exit code.
int run_once(const RunOptions& o, Mode mode, RunSummary& result) {
  ModelOptions mo;
  mo.backend_parameters = o.backend_parameters;
  auto model = load_model(o.model, mo);
  if (!model.ok()) {
    std::fprintf(stderr, "asyncinfer run: %s\n", model.status().to_string().c_str());
    return kExitRunFailed;
  }
  auto device = open_device(o.device);
  if (!device.ok()) {
    std::fprintf(stderr, "asyncinfer run: %s\n", device.status().to_string().c_str());
    return kExitRunFailed;
  }
  std::vector<std::string> class_names;
  auto pre = preprocessing(o, (*model)->signature(), class_names);
  if (!pre.ok()) {
    std::fprintf(stderr, "asyncinfer run: %s\n", pre.status().to_string().c_str());
    return kExitUsage;
  }
  std::vector<std::string> problems;
  std::vector<std::string> files = expand_images(o.images, problems);
  if (o.repeat > 1) {  // the same images again, for steadier throughput figures
    const std::vector<std::string> once = files;
    for (int r = 1; r < o.repeat; ++r) files.insert(files.end(), once.begin(), once.end());
  }
  for (const auto& p : problems) std::fprintf(stderr, "asyncinfer run: skipped: %s\n", p.c_str());
  if (files.empty()) {
    std::fprintf(stderr,
                 "asyncinfer run: no images to run (--images takes files, folders or "
                 "glob patterns)\n");
    return kExitRunFailed;
  }
  std::map<std::string, int> labels;
  if (!o.labels.empty()) {
    auto l = read_labels(o.labels);
    if (!l.ok()) {
      std::fprintf(stderr, "asyncinfer run: %s\n", l.status().to_string().c_str());
      return kExitUsage;
    }
    labels = std::move(*l);
  }

  EngineOptions eo;
  eo.workers = o.workers;
  eo.batching.max_batch_size =
      mode == Mode::sync ? std::optional<std::int64_t>(1) : o.max_batch_size;
  eo.batching.max_queue_delay = std::chrono::microseconds(o.max_queue_delay_us);
  eo.queue_capacity = std::max<std::size_t>(1024, o.window * 2);
  auto engine = Engine::create(*model, *device, eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "asyncinfer run: %s\n", engine.status().to_string().c_str());
    return kExitRunFailed;
  }
  Engine& e = **engine;
  const Preprocess p = *pre;
  const std::size_t classes = static_cast<std::size_t>(
      std::max<std::int64_t>(1, (*model)->signature().outputs.at(0).shape.back()));

  std::vector<Prediction> preds(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    preds[i].file = files[i];
    preds[i].label = labels.empty() ? -1 : label_of(labels, files[i]);
  }
  Progress progress(files.size(), o.quiet);
  std::atomic<std::size_t> done{0};
  const auto t0 = Clock::now();

  auto postprocess = [&](std::size_t i, const Tensor& logits) {
    preds[i].top =
        top_k(logits.data_as<float>(), std::min<std::size_t>(classes, logits.numel()), o.top_k);
  };

  if (mode == Mode::sync) {
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto s = Clock::now();
      auto image = load_image(files[i], p);
      if (!image.ok()) {
        preds[i].error = image.status();
      } else {
        auto out = e.infer({std::move(*image)});
        if (out.ok()) {
          postprocess(i, (*out)[0]);
        } else {
          preds[i].error = out.status();
        }
      }
      preds[i].latency_us = std::chrono::duration<double, std::micro>(Clock::now() - s).count();
      progress.tick(++done);
    }
  } else {
    struct Meta {
      std::size_t index;
      Clock::time_point submitted;
    };
    const int decoders = o.decode_threads > 0
                             ? o.decode_threads
                             : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
    auto pipeline = Pipeline::create(
        {StageSpec::host(
             "decode",
             [&](PipelineItem& item) -> Status {
               const auto& m = std::any_cast<const Meta&>(item.user);
               ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, load_image(files[m.index], p));
               item.tensors = {std::move(t)};
               return Status();
             },
             decoders),
         StageSpec::run_engine("infer", e),
         StageSpec::host(
             "postprocess",
             [&](PipelineItem& item) -> Status {
               const auto& m = std::any_cast<const Meta&>(item.user);
               postprocess(m.index, item.tensors.at(0));
               preds[m.index].latency_us =
                   std::chrono::duration<double, std::micro>(Clock::now() - m.submitted).count();
               return Status();
             })},
        PipelineOptions{.window = o.window, .ordered = false});
    if (!pipeline.ok()) {
      std::fprintf(stderr, "asyncinfer run: %s\n", pipeline.status().to_string().c_str());
      return kExitRunFailed;
    }
    std::vector<Future<PipelineItem>> futures;
    futures.reserve(files.size());
    for (std::size_t i = 0; i < files.size(); ++i) {
      PipelineItem item;
      item.user = Meta{i, Clock::now()};
      auto f = (*pipeline)->submit(std::move(item));  // blocks while the window is full
      f.on_complete([&, i](const Result<PipelineItem>& r) {
        if (!r.ok()) preds[i].error = r.status();
        progress.tick(++done);
      });
      futures.push_back(std::move(f));
    }
    for (auto& f : futures) f.wait();
    (*pipeline)->shutdown();
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t0).count();

  // Summary.
  RunSummary sum;
  sum.mode = mode;
  std::vector<double> latencies;
  for (const Prediction& pr : preds) {
    if (!pr.error.ok()) {
      if (++sum.skipped <= kMaxReported) {
        std::string why(pr.error.message());
        const std::string stage = "stage 'decode': ";
        if (why.rfind(stage, 0) == 0) why.erase(0, stage.size());
        std::fprintf(stderr, "asyncinfer run: skipped: %s\n", why.c_str());
      }
      continue;
    }
    ++sum.ok;
    latencies.push_back(pr.latency_us);
    if (pr.label >= 0) {
      ++sum.labelled;
      if (!pr.top.empty() && pr.top[0].first == pr.label) ++sum.correct;
    }
  }
  if (sum.skipped > kMaxReported) {
    std::fprintf(stderr, "asyncinfer run: ... and %zu more skipped (see --output for each)\n",
                 sum.skipped - kMaxReported);
  }
  sum.latency = summarize(latencies);
  sum.wall_s = wall_s;
  if (preds.size() <= kPrintPredictions && mode == (o.compare ? Mode::sync : o.mode)) {
    for (const Prediction& pr : preds) {
      if (!pr.error.ok() || pr.top.empty()) continue;
      std::string line = pr.file + ": ";
      for (std::size_t i = 0; i < pr.top.size(); ++i) {
        const int c = pr.top[i].first;
        const std::string name = c >= 0 && static_cast<std::size_t>(c) < class_names.size()
                                     ? class_names[static_cast<std::size_t>(c)]
                                     : std::to_string(c);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s (%.3f)", i == 0 ? "" : ", ", name.c_str(),
                      pr.top[i].second);
        line += buf;
      }
      if (pr.label >= 0) line += "  [label " + std::to_string(pr.label) + "]";
      std::printf("%s\n", line.c_str());
    }
  }
  sum.throughput = wall_s > 0 ? static_cast<double>(sum.ok) / wall_s : 0;
  sum.batch_mean = e.metrics().batch_size.mean();
  sum.workers = e.options().workers;  // as the engine chose them (0 asked = its rule)
  result = sum;
  if (!o.output.empty()) {
    std::string path = o.output;
    if (o.compare) {  // one file per mode: name.sync.csv, name.async.csv
      const fs::path f(path);
      path = (f.parent_path() /
              (f.stem().string() + "." + std::string(to_string(mode)) + f.extension().string()))
                 .string();
    }
    Status s = write_predictions(path, preds, class_names);
    if (!s.ok()) {
      std::fprintf(stderr, "asyncinfer run: %s\n", s.to_string().c_str());
      return kExitRunFailed;
    }
  }
  return sum.ok > 0 ? kExitOk : kExitRunFailed;
}

json summary_json(const RunOptions& o, const RunSummary& s) {
  json j{{"mode", to_string(s.mode)},   {"model", o.model},
         {"device", o.device},          {"images_ok", s.ok},
         {"images_skipped", s.skipped}, {"throughput_ips", s.throughput},
         {"duration_s", s.wall_s},      {"batch_size_mean", s.batch_mean}};
  j["accuracy"] = s.labelled > 0 ? json(s.accuracy()) : json(nullptr);
  j["latency_us"] = {{"p50", s.latency.p50 ? json(*s.latency.p50) : json(nullptr)},
                     {"p99", s.latency.p99 ? json(*s.latency.p99) : json(nullptr)}};
  return j;
}

std::string ms_or_none(const std::optional<double>& us) {
  if (!us) return "no samples";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", *us / 1000.0);
  return buf;
}

void print_summary(const RunOptions& o, const RunSummary& s) {
  std::printf("mode            %s\n", std::string(to_string(s.mode)).c_str());
  std::printf("model           %s on %s, %d worker(s)\n", o.model.c_str(), o.device.c_str(),
              s.workers);
  std::printf("images          %zu ok, %zu skipped\n", s.ok, s.skipped);
  if (s.labelled > 0) {
    std::printf("accuracy        %.2f %% (%zu of %zu)\n", 100.0 * s.accuracy(), s.correct,
                s.labelled);
  }
  std::printf("throughput      %.1f images/s (%.3f s)\n", s.throughput, s.wall_s);
  std::printf("latency         p50 %s, p99 %s\n", ms_or_none(s.latency.p50).c_str(),
              ms_or_none(s.latency.p99).c_str());
  std::printf("mean batch      %.2f\n", s.batch_mean);
}

void print_comparison(const RunSummary& a, const RunSummary& b) {
  auto row = [](const char* name, const std::string& x, const std::string& y,
                const std::string& r) {
    std::printf("%-16s %18s %18s %12s\n", name, x.c_str(), y.c_str(), r.c_str());
  };
  auto num = [](double v, const char* fmt) {
    char buf[48];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  std::printf("\n");
  const std::string am(to_string(a.mode));
  const std::string bm(to_string(b.mode));
  row("", am, bm, bm + "/" + am);
  row("images ok", std::to_string(a.ok), std::to_string(b.ok), "");
  if (a.labelled > 0) {
    row("accuracy", num(100.0 * a.accuracy(), "%.2f %%"), num(100.0 * b.accuracy(), "%.2f %%"),
        a.correct == b.correct ? "identical" : "DIFFERENT");
  }
  row("throughput", num(a.throughput, "%.1f img/s"), num(b.throughput, "%.1f img/s"),
      num(a.throughput > 0 ? b.throughput / a.throughput : 0, "%.2fx"));
  auto ratio = [&](const std::optional<double>& x, const std::optional<double>& y) {
    return x && y && *x > 0 ? num(*y / *x, "%.2fx") : std::string("-");
  };
  row("latency p50", ms_or_none(a.latency.p50), ms_or_none(b.latency.p50),
      ratio(a.latency.p50, b.latency.p50));
  row("latency p99", ms_or_none(a.latency.p99), ms_or_none(b.latency.p99),
      ratio(a.latency.p99, b.latency.p99));
  row("mean batch", num(a.batch_mean, "%.2f"), num(b.batch_mean, "%.2f"), "");
}

int run_job(const RunOptions& o) {
  const std::vector<Mode> modes =
      o.compare ? std::vector<Mode>{Mode::sync, Mode::async} : std::vector<Mode>{o.mode};
  std::vector<RunSummary> results;
  json all = json::array();
  for (Mode mode : modes) {
    RunSummary s;
    const int rc = run_once(o, mode, s);
    if (rc != kExitOk) return rc;
    if (!o.compare) print_summary(o, s);
    all.push_back(summary_json(o, s));
    results.push_back(s);
  }
  if (o.compare) print_comparison(results[0], results[1]);
  if (!o.summary.empty()) {
    std::ofstream out(o.summary);
    if (!out) {
      std::fprintf(stderr, "asyncinfer run: cannot write --summary file '%s'\n", o.summary.c_str());
      return kExitRunFailed;
    }
    out << (o.compare ? json{{"runs", all}} : all[0]).dump(2) << "\n";
  }
  if (o.compare && results[0].correct != results[1].correct) {
    std::fprintf(stderr, "asyncinfer run: sync and async predictions differ\n");
    return kExitRunFailed;
  }
  return kExitOk;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* app = parent.add_subcommand(
      "run", "Classify image files with a model: decode -> infer -> top-k, sync or async");
  app->add_option("--model,-m", o->model, "model file (.pt, .onnx, .xml) or URI")->required();
  add_backend_parameter_option(*app, o->backend_parameters);
  app->add_option("--device,-d", o->device, "cpu, sim[:options] or cuda:N")->capture_default_str();
  app->add_option("--images", o->images, "image files, folders or glob patterns")
      ->required()
      ->expected(1, -1);
  app->add_option("--labels", o->labels, "CSV of file,label: enables accuracy");
  app->add_option("--input-size", o->input_size, "resize to SxS (default: model / sidecar)")
      ->check(CLI::Range(1, 8192));
  app->add_option("--mean", o->mean, "normalisation mean after scaling to [0,1]");
  app->add_option("--std", o->std_dev, "normalisation std after scaling to [0,1]");
  app->add_option("--top-k", o->top_k, "classes to report per image")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  add_parsed_option(
      *app, "--mode", o->mode,
      [](std::string_view t) {
        return parse_mode(t, "--mode", {Mode::sync, Mode::async});
      },
      "sync (one image at a time) or async (pipeline)")
      ->default_str("async");
  app->add_option("--workers,-w", o->workers,
                  "engine workers (each a model instance); 0 = the model's own count where it "
                  "has one (OpenVINO's optimal number of infer requests), else one per core for "
                  "a model that computes on host cores, else 1")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  add_max_batch_size_option(*app, o->max_batch_size, "--batch");
  app->add_option("--max-queue-delay-us", o->max_queue_delay_us,
                  "how long the batcher waits for more requests")
      ->check(CLI::Range(0, 10'000'000))
      ->capture_default_str();
  app->add_option("--decode-threads", o->decode_threads, "decode threads (0 = cores)")
      ->check(CLI::Range(0, 256));
  app->add_option("--window", o->window, "images in flight (async)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app->add_option("--output", o->output, "predictions file (.csv or .json)");
  app->add_option("--summary", o->summary, "summary JSON file");
  app->add_flag("--quiet,-q", o->quiet, "no progress line");
  app->add_option("--repeat", o->repeat, "run the image list this many times")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app->add_flag("--compare", o->compare,
                "run sync, then async, in one process and print them side by side");
  return Command{app, [o] { return run_job(*o); }};
}

}  // namespace asyncinfer::cli
