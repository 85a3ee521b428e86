"""Stateful models (sequence_batching) through `asyncinfer serve`, checked with Triton's own
client (tritonclient): sequences interleaved over HTTP, gRPC and the gRPC stream, each seeing only
its own state (implicit state kept by the server); more sequences than slots (the backlog); a
backlogged sequence that times out and a vanished client's sequence reaped after its idle time,
with Triton's messages; Triton's errors for bad sequence requests; a Python model that crashes in
the middle of a sequence. The models are tests/server/triton_models/ (accumulator.py: OUTPUT =
ACC_IN + INPUT, the sum kept by the server as state; sequence.py: Triton's example models)."""

import os
import threading
import time
import unittest
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import harness
from harness import Repository
from triton_fixture import Collector, serve

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "triton_models")


def accumulator_config(name, max_batch_size=8, instances=2, idle_us=2000000, extra=""):
    return """name: "%s"
backend: "python"
max_batch_size: %d
sequence_batching {
  max_sequence_idle_microseconds: %d
  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "ACC_IN", output_name: "ACC_OUT", data_type: TYPE_INT32, dims: [ 1 ],
            initial_state: { data_type: TYPE_INT32, dims: [ 1 ], zero_data: true, name: "z" } } ]
}
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU, count: %d } ]
%s""" % (name, max_batch_size, idle_us, instances, extra)


CRASHING = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            if int(x[0][0]) == -999:
                os._exit(3)  # the process dies in the middle of a sequence
            acc = pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
            total = (acc + x).astype(np.int32)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return out
'''


# Each request's INPUT has its own length; ACC_OUT = ACC_IN + sum(INPUT), OUTPUT = INPUT + ACC_IN;
# SHAPES = how many distinct INPUT shapes this execute() got (Triton's python backend hands it
# each request's own tensors, so sequences of different lengths may share a batch).
RAGGED = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.03)  # so that the other sequences' next requests join the next batch
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        shapes = np.array([[len({x.shape for x in xs})]], np.int32)
        out = []
        for r, x in zip(requests, xs):
            acc = pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", (x + acc).astype(np.int32)),
                pb_utils.Tensor("ACC_OUT", (acc + x.sum()).astype(np.int32)),
                pb_utils.Tensor("SHAPES", shapes)]))
        return out
'''


def value(v, client=grpcclient):
    i = client.InferInput("INPUT", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[v]], np.int32))
    return i


class Sequences(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        repo = Repository()
        src = os.path.join(MODELS, "accumulator.py")
        repo.add("acc", accumulator_config("acc"), files={"1/model.py": src})
        repo.add("one_slot", accumulator_config("one_slot", max_batch_size=1, instances=1,
                                                idle_us=300000), files={"1/model.py": src})
        # Its state starts at 100: initial_state data_file, read from <model>/initial_state/.
        repo.add("acc_from_100", accumulator_config("acc_from_100").replace(
            'zero_data: true, name: "z"', 'data_file: "hundred.bin", name: "hundred"'),
                 files={"1/model.py": src})
        os.makedirs(os.path.join(repo.path, "acc_from_100", "initial_state"))
        np.array([100], np.int32).tofile(
            os.path.join(repo.path, "acc_from_100", "initial_state", "hundred.bin"))
        crash = os.path.join(repo.path, "crash.py")
        with open(crash, "w") as f:
            f.write(CRASHING)
        repo.add("crashing", accumulator_config("crashing", max_batch_size=1, instances=2),
                 files={"1/model.py": crash})
        ragged = os.path.join(repo.path, "ragged.py")
        with open(ragged, "w") as f:
            f.write(RAGGED)
        repo.add("ragged", accumulator_config("ragged", instances=1).replace(
            'name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ]',
            'name: "INPUT", data_type: TYPE_INT32, dims: [ -1 ]').replace(
            'output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]',
            'output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ -1 ] },\n'
            '         { name: "SHAPES", data_type: TYPE_INT32, dims: [ 1 ] } ]'),
                 files={"1/model.py": ragged})
        # An ensemble whose one step is the stateful model: it carries the sequence parameters.
        repo.add("acc_ensemble", 'name: "acc_ensemble"\nplatform: "ensemble"\n'
                 'max_batch_size: 8\n'
                 'input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
                 'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
                 'ensemble_scheduling { step [ { model_name: "acc" model_version: -1 '
                 'input_map { key: "INPUT" value: "X" } '
                 'output_map { key: "OUTPUT" value: "Y" } } ] }\n')
        with open(os.path.join(MODELS, "simple_dyna_sequence", "config.pbtxt")) as f:
            repo.add("simple_dyna_sequence", f.read(),
                     files={"1/model.py": os.path.join(MODELS, "sequence.py")})
        serve(cls, repo.path, repo=repo)

    def grpc_infer(self, model, v, sid, start=False, end=False, **kw):
        r = self.grpc.infer(model, [value(v)], sequence_id=sid, sequence_start=start,
                            sequence_end=end, **kw)
        return int(r.as_numpy("OUTPUT")[0][0])

    def test_interleaved_sequences_over_every_protocol_see_only_their_own_state(self):
        steps = 12
        errors = []
        results = {}

        def http_seq(sid):
            c = httpclient.InferenceServerClient("127.0.0.1:%d" % self.server.http_port)
            try:
                got = []
                for k in range(steps):
                    r = c.infer("acc", [value(sid % 100, httpclient)], sequence_id=sid,
                                sequence_start=k == 0, sequence_end=k == steps - 1)
                    got.append(int(r.as_numpy("OUTPUT")[0][0]))
                results[sid] = got
            except Exception as e:  # noqa: BLE001 — reported below
                errors.append(e)
            finally:
                c.close()

        def grpc_seq(sid):
            try:
                results[sid] = [self.grpc_infer("acc", sid % 100, sid, k == 0, k == steps - 1)
                                for k in range(steps)]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=http_seq, args=(100 + i,)) for i in range(4)]
        threads += [threading.Thread(target=grpc_seq, args=(200 + i,)) for i in range(4)]
        for t in threads:
            t.start()
        # Four sequences on one stream, their requests interleaved; string IDs.
        stream = grpcclient.InferenceServerClient(self.server.grpc_target)
        got = Collector()
        stream.start_stream(callback=got)
        ids = ["s-%d" % i for i in range(4)]
        for k in range(steps):
            for i, sid in enumerate(ids):
                stream.async_stream_infer("acc", [value(i + 1)], request_id="%s/%d" % (sid, k),
                                          sequence_id=sid, sequence_start=k == 0,
                                          sequence_end=k == steps - 1)
        by_id = {sid: [] for sid in ids}
        for result, error in got.take(4 * steps):
            self.assertIsNone(error)
            sid = result.get_response().id.split("/")[0]
            by_id[sid].append(int(result.as_numpy("OUTPUT")[0][0]))
        stream.stop_stream()
        stream.close()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        for sid, sums in results.items():
            self.assertEqual(sums, [(sid % 100) * (k + 1) for k in range(steps)], sid)
        for i, sid in enumerate(ids):
            self.assertEqual(by_id[sid], [(i + 1) * (k + 1) for k in range(steps)], sid)

    def test_more_sequences_than_slots_wait_in_the_backlog_and_drain_in_order(self):
        # 16 slots (2 instances x 8); 40 sequences of 3 requests each, all sent at once.
        stream = grpcclient.InferenceServerClient(self.server.grpc_target)
        got = Collector()
        stream.start_stream(callback=got)
        for s in range(40):
            for k in range(3):
                stream.async_stream_infer("acc", [value(s)], request_id="%d/%d" % (s, k),
                                          sequence_id=5000 + s, sequence_start=k == 0,
                                          sequence_end=k == 2)
        sums = {}
        for result, error in got.take(120, timeout=60):
            self.assertIsNone(error)
            s = int(result.get_response().id.split("/")[0])
            sums.setdefault(s, []).append(int(result.as_numpy("OUTPUT")[0][0]))
        stream.stop_stream()
        stream.close()
        self.assertEqual(sums, {s: [s, 2 * s, 3 * s] for s in range(40)})

    def test_a_backlogged_sequence_that_times_out_gets_tritons_message(self):
        self.assertEqual(self.grpc_infer("one_slot", 1, 61, start=True), 1)  # holds the slot
        with self.assertRaises(InferenceServerException) as e:
            self.grpc_infer("one_slot", 1, 62, start=True, timeout=100000)  # 100 ms, in us
        self.assertIn("timeout of the corresponding sequence has been expired", str(e.exception))
        self.assertEqual(self.grpc_infer("one_slot", 2, 61, end=True), 3)  # 61 goes on
        text = urllib.request.urlopen(self.server.metrics_url, timeout=10).read().decode()
        labels = dict(model="one_slot", version="1")
        self.assertEqual(harness.metric(text, "asyncinfer_sequence_backlog_expired", **labels), 1)
        self.assertEqual(harness.metric(text, "asyncinfer_sequences_live", **labels), 0)
        self.assertEqual(harness.metric(text, "asyncinfer_sequence_backlog", **labels), 0)

    def test_a_vanished_clients_sequence_is_reaped_and_its_slot_serves_the_next(self):
        self.assertEqual(self.grpc_infer("one_slot", 5, 71, start=True), 5)  # then vanishes
        t0 = time.monotonic()
        self.assertEqual(self.grpc_infer("one_slot", 7, 72, start=True, end=True), 7)
        self.assertGreaterEqual(time.monotonic() - t0, 0.2)  # waited for the 300 ms idle
        with self.assertRaises(InferenceServerException) as e:
            self.grpc_infer("one_slot", 1, 71)
        self.assertIn("inference request for sequence 71 to model 'one_slot' must specify the "
                      "START flag on the first request of the sequence", str(e.exception))

    def test_tritons_errors_for_bad_sequence_requests(self):
        cases = [
            (dict(sid=0), "inference request to model 'acc' must specify a non-zero or "
                          "non-empty correlation ID"),
            (dict(sid=81), "inference request for sequence 81 to model 'acc' must specify the "
                           "START flag on the first request of the sequence"),
        ]
        for kw, message in cases:
            with self.assertRaises(InferenceServerException) as e:
                self.grpc_infer("acc", 1, kw["sid"])
            self.assertIn(message, str(e.exception))
            with self.assertRaises(InferenceServerException) as e:
                self.http.infer("acc", [value(1, httpclient)], sequence_id=kw["sid"])
            self.assertIn(message, str(e.exception))
        two = grpcclient.InferInput("INPUT", [2, 1], "INT32")
        two.set_data_from_numpy(np.array([[1], [2]], np.int32))
        with self.assertRaises(InferenceServerException) as e:
            self.grpc.infer("acc", [two], sequence_id=82, sequence_start=True)
        self.assertIn("inference request to model 'acc' must specify batch-size 1 due to "
                      "requirements of sequence batcher", str(e.exception))
        # A string ID on a model whose CORRID control is UINT64, and the reverse is fine.
        with self.assertRaises(InferenceServerException) as e:
            self.grpc_infer("simple_dyna_sequence", 1, "abc", start=True)
        self.assertIn("string", str(e.exception))
        self.assertEqual(self.grpc_infer("acc", 4, "text-id", start=True, end=True), 4)

    def test_sequences_of_different_lengths_share_a_batch_of_a_python_model(self):
        # 4 sequences at once on one instance (8 slots), sequence s sending s + 1 values a step:
        # their requests meet in batches, each with its own shape and its own state.
        steps = 6
        errors = []
        results = {}
        mixed = []

        def run(s):
            try:
                c = grpcclient.InferenceServerClient(self.server.grpc_target)
                acc, got = 0, []
                for k in range(steps):
                    x = np.arange(s + 1, dtype=np.int32).reshape(1, -1) + k
                    i = grpcclient.InferInput("INPUT", list(x.shape), "INT32")
                    i.set_data_from_numpy(x)
                    r = c.infer("ragged", [i], sequence_id=600 + s, sequence_start=k == 0,
                                sequence_end=k == steps - 1, client_timeout=30)
                    got.append(r.as_numpy("OUTPUT").tolist())
                    mixed.append(int(r.as_numpy("SHAPES")[0][0]))
                    self.assertEqual(got[-1], (x + acc).tolist())
                    acc += int(x.sum())
                results[s] = got
                c.close()
            except Exception as e:  # noqa: BLE001 — reported below
                errors.append(str(e))

        threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(results), [0, 1, 2, 3])
        self.assertGreater(max(mixed), 1, "no batch held sequences of different lengths")

    def test_a_sequence_through_an_ensemble(self):
        def step(v, start=False, end=False):
            i = grpcclient.InferInput("X", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[v]], np.int32))
            r = self.grpc.infer("acc_ensemble", [i], sequence_id=301, sequence_start=start,
                                sequence_end=end)
            return int(r.as_numpy("Y")[0][0])
        self.assertEqual([step(2, start=True), step(3), step(4, end=True)], [2, 5, 9])
        with self.assertRaises(InferenceServerException) as e:
            step(1)  # the sequence has ended: the step model refuses, the ensemble says where
        self.assertIn("must specify the START flag", str(e.exception))
        self.assertIn("in ensemble 'acc_ensemble', ", str(e.exception))

    def test_initial_state_from_a_data_file(self):
        self.assertEqual([self.grpc_infer("acc_from_100", 1, 401, start=True),
                          self.grpc_infer("acc_from_100", 2, 401, end=True)], [101, 103])

    def test_a_python_model_that_crashes_mid_sequence(self):
        # Two instances, one slot each: sequences 91 and 92 run on different processes.
        self.assertEqual(self.grpc_infer("crashing", 1, 91, start=True), 1)
        self.assertEqual(self.grpc_infer("crashing", 10, 92, start=True), 10)
        with self.assertRaises(InferenceServerException):
            self.grpc_infer("crashing", -999, 91)
        # The other sequence goes on; the crashed one keeps its slot and its state (the server
        # holds it), on a new process, and ends; every slot is free again after.
        self.assertEqual(self.grpc_infer("crashing", 5, 92, end=True), 15)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.assertEqual(self.grpc_infer("crashing", 2, 91, end=True), 3)
                break
            except InferenceServerException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for sid in (93, 94):
            self.assertEqual(self.grpc_infer("crashing", 6, sid, start=True, end=True), 6)


if __name__ == "__main__":
    harness.main()
