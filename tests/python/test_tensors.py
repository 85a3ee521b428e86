"""Tensors in and out: every dtype, zero copy where allowed, guarantee 6, clear errors."""
import concurrent.futures
import time

import numpy as np
import pytest

import asyncinfer
from conftest import WAIT, slow_model

torch = pytest.importorskip("torch")

# Every dtype the engine has, as (engine name, numpy dtype); bf16 has no numpy dtype.
NUMPY_DTYPES = [("bool", np.bool_), ("i8", np.int8), ("i16", np.int16), ("i32", np.int32),
                ("i64", np.int64), ("u8", np.uint8), ("u16", np.uint16), ("u32", np.uint32),
                ("u64", np.uint64), ("f16", np.float16), ("f32", np.float32),
                ("f64", np.float64)]
TORCH_DTYPES = [("bool", torch.bool), ("i8", torch.int8), ("i16", torch.int16),
                ("i32", torch.int32), ("i64", torch.int64), ("u8", torch.uint8),
                ("f16", torch.float16), ("bf16", torch.bfloat16), ("f32", torch.float32),
                ("f64", torch.float64)]


def engine_for(dtype, **kw):
    return asyncinfer.Engine(f"builtin:identity?dtype={dtype}&shape=3x2", "cpu", **kw)


def sample(np_dtype):
    values = np.arange(-3, 3).reshape(1, 3, 2) * 7
    if np_dtype == np.bool_:
        return values % 2 == 0
    if np.issubdtype(np_dtype, np.unsignedinteger):  # near the top of the range
        top = np.iinfo(np_dtype).max
        return (top - np.arange(6, dtype=np_dtype) * np_dtype(7)).reshape(1, 3, 2)
    return values.astype(np_dtype)


@pytest.mark.parametrize("name,np_dtype", NUMPY_DTYPES)
def test_every_numpy_dtype_round_trips(name, np_dtype):
    a = sample(np_dtype)
    with engine_for(name) as e:
        assert e.signature.inputs[0].dtype == name
        for out in (e.infer(a)[0], e.submit(a).result(WAIT)[0]):
            assert isinstance(out, np.ndarray)
            assert out.dtype == np_dtype and out.shape == a.shape
            np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("name,torch_dtype", TORCH_DTYPES)
def test_every_torch_dtype_round_trips(name, torch_dtype):
    t = (torch.arange(-3, 3).reshape(1, 3, 2) * 7).to(torch_dtype)
    with engine_for(name) as e:
        out = e.submit(t).result(WAIT)[0]
        back = torch.from_dlpack(out) if torch_dtype != torch.bool else torch.from_numpy(out)
        assert back.dtype == torch_dtype
        assert torch.equal(back, t)


def test_bf16_output_is_an_asyncinfer_tensor_with_dlpack():
    t = torch.tensor([[[1.5, -2.0], [3.25, 0.0], [7.0, 8.0]]], dtype=torch.bfloat16)
    with engine_for("bf16") as e:
        out = e.infer(t)[0]
        assert isinstance(out, asyncinfer.Tensor)
        assert out.dtype == "bf16" and out.shape == (1, 3, 2) and out.nbytes == 12
        assert torch.equal(torch.from_dlpack(out), t)
        assert out.numpy().dtype == np.uint16  # the bit patterns
        np.testing.assert_array_equal(out.numpy(), t.view(torch.int16).numpy().view(np.uint16))
        # An output may be handed back in as an input.
        assert torch.equal(torch.from_dlpack(e.infer(out)[0]), t)


def test_outputs_are_numpy_views_kept_alive_and_from_dlpack_shares_them():
    e = asyncinfer.Engine("builtin:identity", "cpu")
    out = e.infer(np.arange(8, dtype=np.float32).reshape(2, 4))[0]
    e.shutdown()
    del e
    assert out.base is not None and not out.flags.owndata  # a view of the engine's tensor
    np.testing.assert_array_equal(out, np.arange(8).reshape(2, 4))
    t = torch.from_dlpack(out)
    t[0, 0] = 42.0  # same memory
    assert out[0, 0] == 42.0


def test_guarantee_6_submit_copies_so_the_caller_may_overwrite():
    with asyncinfer.Engine(slow_model(300), "cpu") as e:
        a = np.ones((1, 4), np.float32)
        f = e.submit(a)
        a[:] = 7.0  # the model has not read its input yet (it sleeps first)
        np.testing.assert_array_equal(f.result(WAIT)[0], np.ones((1, 4)))
        t = torch.ones(1, 4)
        f = e.submit(t)
        t.fill_(7.0)
        np.testing.assert_array_equal(f.result(WAIT)[0], np.ones((1, 4)))


def test_share_inputs_reads_the_callers_memory_without_a_copy():
    with asyncinfer.Engine(slow_model(300), "cpu") as e:
        a = np.ones((1, 4), np.float32)
        f = e.submit(a, share_inputs=True)
        a[:] = 7.0  # shared: the model copies it later, so it sees the new values
        np.testing.assert_array_equal(f.result(WAIT)[0], np.full((1, 4), 7.0))
        t = torch.ones(1, 4)
        f = e.submit(t, share_inputs=True)
        t.fill_(7.0)
        np.testing.assert_array_equal(f.result(WAIT)[0], np.full((1, 4), 7.0))


def test_shared_input_outlives_the_callers_reference():
    with asyncinfer.Engine(slow_model(200), "cpu") as e:
        f = e.submit(np.full((1, 4), 3.0, np.float32), share_inputs=True)  # only the engine holds it
        np.testing.assert_array_equal(f.result(WAIT)[0], np.full((1, 4), 3.0))


def test_non_contiguous_arrays_are_copied_once_and_give_the_same_result(identity):
    base = np.arange(32, dtype=np.float32).reshape(4, 8)
    view = base[:, ::2]
    assert not view.flags.c_contiguous
    np.testing.assert_array_equal(identity.infer(view)[0], np.ascontiguousarray(view))
    t = torch.arange(32, dtype=torch.float32).reshape(4, 8).t()
    assert not t.is_contiguous()
    np.testing.assert_array_equal(identity.submit(t).result(WAIT)[0], t.contiguous().numpy())


def test_requires_grad_tensors_are_detached(identity):
    t = torch.ones(2, 3, requires_grad=True)
    np.testing.assert_array_equal(identity.infer(t)[0], np.ones((2, 3)))


def test_dict_and_list_inputs_by_name():
    with asyncinfer.Engine("builtin:identity?inputs=2", "cpu") as e:
        a, b = np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32)
        for inputs in ([a, b], (a, b), {"input0": a, "input1": b}):
            o0, o1 = e.infer(inputs)
            np.testing.assert_array_equal(o0, a)
            np.testing.assert_array_equal(o1, b)


def bad(engine, inputs, *fragments):
    """Every way in rejects `inputs` with InvalidArgument naming `fragments`; nothing is
    submitted."""
    before = engine.metrics()
    calls = [lambda: engine.infer(inputs), lambda: engine.submit(inputs),
             lambda: engine.submit(inputs, callback=lambda r: None),
             lambda: engine.submit_id("bad", inputs)]
    for call in calls:
        with pytest.raises(asyncinfer.InvalidArgument) as info:
            call()
        assert isinstance(info.value, ValueError)
        assert info.value.code == "invalid_argument"
        for fragment in fragments:
            assert fragment in str(info.value), (fragment, str(info.value))
    after = engine.metrics()
    assert after["submitted"] == before["submitted"]
    assert after["completed"] == before["completed"]
    assert engine.status("bad") == asyncinfer.RequestState.unknown


def test_wrong_dtype_names_the_input_and_both_dtypes(identity):
    bad(identity, np.zeros((1, 4), np.float64), "input0", "f32", "f64")
    bad(identity, torch.zeros(1, 4, dtype=torch.int64), "input0", "f32", "i64")


def test_wrong_shape_names_the_expected_shape():
    with asyncinfer.Engine("builtin:identity?shape=1x32x32", "cpu") as e:
        bad(e, np.zeros((1, 1, 32, 31), np.float32), "input0", "32", "31")
        bad(e, np.zeros((1, 32, 32), np.float32), "input0", "rank")
        bad(e, np.zeros((0, 1, 32, 32), np.float32), "batch")


def test_object_string_and_complex_arrays_are_refused(identity):
    # An object array is read as BYTES: its elements must be bytes or str, and the model's input
    # must be BYTES.
    bad(identity, np.array([[1, "a"]], dtype=object), "input0", "element 0 is int", "object")
    bad(identity, np.array([[b"a", "b"]], dtype=object), "input0", "bytes", "f32")
    bad(identity, np.array([["ab", "cd"]]), "input0", "<U2")
    bad(identity, np.zeros((1, 2), np.complex64), "complex64")
    bad(identity, np.zeros((1, 2), np.dtype(">f4")), "big-endian")


def test_not_a_tensor_is_refused(identity):
    bad(identity, [[1.0, 2.0]], "numpy.ndarray")  # a list of one element, itself a list
    bad(identity, "text", "numpy.ndarray", "str")
    bad(identity, 3.0, "numpy.ndarray", "float")


def test_tensor_on_another_device_is_refused(identity):
    bad(identity, torch.zeros(1, 4, device="meta"), "input0", "meta", ".cpu()")

    class CudaArray:  # any DLPack producer on a GPU
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

    bad(identity, CudaArray(), "input0", "cuda:0", "host memory")


def test_wrong_number_of_inputs():
    with asyncinfer.Engine("builtin:identity?inputs=2", "cpu") as e:
        a = np.zeros((1, 2), np.float32)
        bad(e, [a], "takes 2 input", "got 1")
        bad(e, [a, a, a], "takes 2 input", "got 3")
        bad(e, a, "takes 2 inputs", "list, tuple or dict")
        bad(e, {"input0": a}, "no 'input1'")
        bad(e, {"input0": a, "input1": a, "extra": a}, "unknown input 'extra'")


def test_mismatched_batch_dims(identity):
    with asyncinfer.Engine("builtin:identity?inputs=2", "cpu") as e:
        bad(e, [np.zeros((1, 2), np.float32), np.zeros((2, 2), np.float32)], "batch dim 0")


def test_a_batch_in_one_request():
    with asyncinfer.Engine("builtin:identity?shape=3", "cpu") as e:
        a = np.arange(30, dtype=np.float32).reshape(10, 3)
        np.testing.assert_array_equal(e.infer(a)[0], a)
        futures = [e.submit(a[i:i + 1]) for i in range(10)]  # batched together by the engine
        done, _ = concurrent.futures.wait(futures, timeout=WAIT)
        assert len(done) == 10
        np.testing.assert_array_equal(np.concatenate([f.result()[0] for f in futures]), a)


def test_time_monotonic_is_the_engines_clock():
    with asyncinfer.Engine(slow_model(500), "cpu") as e:
        f = e.submit(np.zeros((1, 4), np.float32), deadline=time.monotonic() + 0.05)
        with pytest.raises(asyncinfer.DeadlineExceeded):
            f.result(WAIT)
