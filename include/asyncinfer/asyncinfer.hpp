// asyncinfer.hpp — the umbrella header: everything a user of the library needs.
//
//   status.hpp    Status, StatusCode, Result<T>: the one error model
//   tensor.hpp    Tensor, DType, Shape, Storage
//   future.hpp    Future<T>, Promise<T>, when_all, when_any
//   executor.hpp  ThreadPool (completion executor), DeadlineTimer
//   device.hpp    Device, Stream, Event, EventPool, open_device
//   model.hpp     Model, ModelInstance, ModelSignature, load_model
//   engine.hpp    Engine: sync/async inference, callbacks, futures, request ids
//   execution_gate.hpp  ExecutionGate: what a worker passes before a batch runs (rate limiter)
//   pipeline.hpp  Pipeline: stages overlapped on streams
//   policy.hpp    RetryPolicy, CircuitBreakerOptions
//   metrics.hpp   Histogram, EngineMetrics, Prometheus text
//   log.hpp       set_log_hook: where the library's messages go
#pragma once

#include "asyncinfer/device.hpp"
#include "asyncinfer/engine.hpp"
#include "asyncinfer/execution_gate.hpp"
#include "asyncinfer/executor.hpp"
#include "asyncinfer/future.hpp"
#include "asyncinfer/log.hpp"
#include "asyncinfer/metrics.hpp"
#include "asyncinfer/model.hpp"
#include "asyncinfer/pipeline.hpp"
#include "asyncinfer/policy.hpp"
#include "asyncinfer/status.hpp"
#include "asyncinfer/tensor.hpp"
