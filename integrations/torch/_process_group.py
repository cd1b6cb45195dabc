"""``ProcessGroupHal``: a torch.distributed process group whose collectives run on hal.comm."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import hal
import hal.comm
from hal.comm._init import init_from_store
from hal.torch._tensors import Staged, check_tensor

__all__ = ["ProcessGroupHal", "create_process_group"]

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.AVG: "avg",
}


def _op(reduce_op: Any) -> str:
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    raise ValueError(f"reduce op {reduce_op!r} is not supported by the 'hal' backend (SUM, PRODUCT, MIN, MAX, AVG)")


def _done(result: Any) -> Any:
    """A completed torch ``Work`` whose future holds ``result``."""
    fut: Future[Any] = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _same_dtype(tensors: list[torch.Tensor], name: str) -> torch.dtype:
    dt = tensors[0].dtype
    for i, t in enumerate(tensors):
        check_tensor(t, f"{name}[{i}]")
        if t.dtype != dt:
            raise TypeError(f"{name}[{i}].dtype={t.dtype} differs from {name}[0].dtype={dt}")
    return dt


def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"{what} takes one tensor per process with the 'hal' backend, got {len(tensors)}")
    return check_tensor(tensors[0], what)


class ProcessGroupHal(dist.ProcessGroup):
    """A ``torch.distributed.ProcessGroup`` whose collectives run on a :class:`hal.comm.Communicator`.

    Made by ``torch.distributed.init_process_group("hal")`` (or ``new_group(backend="hal")``) once
    :mod:`hal.torch` is imported; the ranks meet through the store torch hands the backend.
    Every call is synchronous: it returns a completed ``Work`` whose future holds the output.

    Attributes:
        communicator: the hal.comm communicator (device: the CPU emulator's device
            ``LOCAL_RANK % count``; transport as for :func:`hal.comm.init`).
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        timeout_ms = None if os.environ.get("HAL_COMM_TIMEOUT_MS") else timeout.total_seconds() * 1e3
        # the n-th process group built on this store by this rank meets the n-th of the others;
        # the count lives in the store, so a destroyed-and-rebuilt default group gets fresh keys
        instance = int(store.add(f"hal/instances/{rank}", 1))
        cpu = hal.devices("cpu")
        local = int(os.environ.get("LOCAL_RANK", rank))
        self.communicator = init_from_store(
            store, rank, size, prefix=f"hal/{instance}", device=cpu[local % len(cpu)], timeout_ms=timeout_ms
        )
        self._device = self.communicator.device
        self._stream = self._device.create_stream()

    # -- identity -------------------------------------------------------------------------
    def getBackendName(self) -> str:
        """``"hal"``."""
        return "hal"

    @property
    def group_name(self) -> str:  # type: ignore[override]
        """The group name torch assigned."""
        return str(getattr(self, "_hal_group_name", ""))

    def _set_group_name(self, name: str) -> None:
        self._hal_group_name = name
        super()._set_group_name(name)

    def shutdown(self) -> None:
        """Close the hal communicator (``destroy_process_group``)."""
        self.communicator.close()

    def abort(self) -> None:
        """Abort the hal communicator: running calls fail at once."""
        self.communicator.abort()

    # -- helpers --------------------------------------------------------------------------
    def _stage(self, dtype: torch.dtype, count: int, fill: list[torch.Tensor]) -> Staged:
        return Staged(self._device, self._stream, dtype, count, fill)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_reduce``: reduce ``tensors[0]`` in place across ranks."""
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        t = _one(tensors, "all_reduce tensor")
        with self._stage(t.dtype, t.numel(), [t]) as st:
            self.communicator.all_reduce(st.array, op=op, stream=self._stream).wait()
            st.copy_out([t])
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_reduce_coalesced``: one all_reduce over the tensors' concatenation."""
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not tensors:
            return _done(tensors)
        dt = _same_dtype(tensors, "tensors")
        with self._stage(dt, sum(t.numel() for t in tensors), tensors) as st:
            self.communicator.all_reduce(st.array, op=op, stream=self._stream).wait()
            st.copy_out(tensors)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``broadcast``: root's ``tensors[0]`` to every rank."""
        t = _one(tensors, "broadcast tensor")
        root = int(opts.rootRank)
        with self._stage(t.dtype, t.numel(), [t]) as st:
            self.communicator.broadcast(st.array, root=root, stream=self._stream).wait()
            if self.rank() != root:
                st.copy_out([t])
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        """``reduce``: the reduction lands in root's ``tensors[0]``."""
        t = _one(tensors, "reduce tensor")
        op, root = _op(opts.reduceOp), int(opts.rootRank)
        with self._stage(t.dtype, t.numel(), [t]) as st:
            self.communicator.reduce(st.array, op=op, root=root, stream=self._stream).wait()
            if self.rank() == root:
                st.copy_out([t])
        return _done(tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_gather``: every rank's ``inputs[0]`` into ``outputs[0][r]``."""
        t = _one(inputs, "all_gather input")
        if len(outputs) != 1 or len(outputs[0]) != self.size():
            raise ValueError(f"all_gather needs a list of {self.size()} output tensors")
        outs = outputs[0]
        for i, o in enumerate(outs):
            check_tensor(o, f"tensor_list[{i}]")
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"tensor_list[{i}] ({o.numel()} x {o.dtype}) differs from the input ({t.numel()} x {t.dtype})")
        n = t.numel()
        with self._stage(t.dtype, n * self.size(), []) as st:
            with self._stage(t.dtype, n, [t]) as src:
                self.communicator.all_gather(src.array, st.array, stream=self._stream).wait()
            st.copy_out(outs)
        return _done(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """``all_gather_into_tensor``: every rank's ``input`` concatenated into ``output``."""
        check_tensor(input, "input_tensor")
        check_tensor(output, "output_tensor")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"output_tensor ({output.numel()} x {output.dtype}) must hold {self.size()} x the input "
                f"({input.numel()} x {input.dtype})"
            )
        with self._stage(input.dtype, output.numel(), []) as st:
            with self._stage(input.dtype, input.numel(), [input]) as src:
                self.communicator.all_gather(src.array, st.array, stream=self._stream).wait()
            st.copy_out([output])
        return _done([output])

    _allgather_base = all_gather_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        """``reduce_scatter``: reduce ``inputs[0][r]`` across ranks into rank r's ``outputs[0]``."""
        out = _one(outputs, "reduce_scatter output")
        if len(inputs) != 1 or len(inputs[0]) != self.size():
            raise ValueError(f"reduce_scatter needs a list of {self.size()} input tensors")
        ins = inputs[0]
        for i, x in enumerate(ins):
            check_tensor(x, f"input_list[{i}]")
            if x.numel() != out.numel() or x.dtype != out.dtype:
                raise ValueError(f"input_list[{i}] ({x.numel()} x {x.dtype}) differs from the output ({out.numel()} x {out.dtype})")
        return self._reduce_scatter(out, ins, _op(opts.reduceOp))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        """``reduce_scatter_tensor``: reduce ``input`` across ranks; segment ``rank`` lands in ``output``."""
        check_tensor(output, "output")
        check_tensor(input, "input")
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                f"input ({input.numel()} x {input.dtype}) must hold {self.size()} x the output "
                f"({output.numel()} x {output.dtype})"
            )
        return self._reduce_scatter(output, [input], _op(opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single

    def _reduce_scatter(self, out: torch.Tensor, ins: list[torch.Tensor], op: str) -> Any:
        n = out.numel()
        with self._stage(out.dtype, n * self.size(), ins) as st:
            self.communicator.reduce_scatter(st.array, op=op, stream=self._stream).wait()
            st.copy_out([out], start=self.rank() * n)
        return _done([out])

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any = None
    ) -> Any:
        """``all_to_all_single``: block i of ``input`` to rank i (even or uneven splits)."""
        check_tensor(input, "input")
        check_tensor(output, "output")
        size = self.size()
        rows_in, rows_out = max(input.shape[0], 1) if input.dim() else 1, max(output.shape[0], 1) if output.dim() else 1
        row_in, row_out = input.numel() // rows_in, output.numel() // rows_out
        ins = [s * row_in for s in in_splits] if in_splits else [input.numel() // size] * size
        outs = [s * row_out for s in out_splits] if out_splits else [output.numel() // size] * size
        if sum(ins) != input.numel() or sum(outs) != output.numel() or len(ins) != size or len(outs) != size:
            raise ValueError(f"all_to_all_single: splits {in_splits}/{out_splits} do not cut the tensors into {size} blocks")
        return self._all_to_all(output, input, outs, ins)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_to_all``: ``inputs[i]`` to rank i, rank i's block into ``outputs[i]``."""
        size = self.size()
        if len(inputs) != size or len(outputs) != size:
            raise ValueError(f"all_to_all needs {size} input and {size} output tensors")
        dt = _same_dtype(list(inputs) + list(outputs), "tensors")
        src_host = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0, dtype=dt)
        out_host = torch.empty(sum(t.numel() for t in outputs), dtype=dt)
        self._all_to_all(out_host, src_host, [t.numel() for t in outputs], [t.numel() for t in inputs])
        off = 0
        for t in outputs:
            t.view(-1).copy_(out_host[off : off + t.numel()])
            off += t.numel()
        return _done(outputs)

    def _all_to_all(self, output: torch.Tensor, input: torch.Tensor, outs: list[int], ins: list[int]) -> Any:
        size, dt = self.size(), input.dtype
        if len(set(ins)) == 1 and len(set(outs)) == 1 and ins[0] == outs[0]:
            with self._stage(dt, input.numel(), [input]) as st:
                self.communicator.all_to_all(st.array, stream=self._stream).wait()
                st.copy_out([output])
            return _done([output])
        # uneven blocks: agree on the largest block, pad every block to it, one all_to_all
        sizes = torch.tensor([max(ins)] * size, dtype=torch.int64)
        with self._stage(torch.int64, size, [sizes]) as st:
            self.communicator.all_reduce(st.array, op="max", stream=self._stream).wait()
            st.copy_out([sizes])
        block = int(sizes[0])
        src = torch.zeros(size * block, dtype=dt)
        flat_in = input.reshape(-1)
        off = 0
        for i, n in enumerate(ins):
            src[i * block : i * block + n] = flat_in[off : off + n]
            off += n
        with self._stage(dt, size * block, [src]) as st:
            self.communicator.all_to_all(st.array, stream=self._stream).wait()
            st.copy_out([src])
        flat_out = output.view(-1)
        off = 0
        for i, n in enumerate(outs):
            flat_out[off : off + n] = src[i * block : i * block + n]
            off += n
        return _done([output])

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        """``gather``: every rank's ``inputs[0]`` into root's ``outputs[0][r]`` (point to point)."""
        t = _one(inputs, "gather input")
        root, me = int(opts.rootRank), self.rank()
        if me == root:
            outs = outputs[0]
            if len(outs) != self.size():
                raise ValueError(f"gather needs a list of {self.size()} output tensors on the root")
            for r, o in enumerate(outs):
                check_tensor(o, f"gather_list[{r}]")
                if r == me:
                    o.copy_(t)
                    continue
                with self._stage(o.dtype, o.numel(), []) as st:
                    self.communicator.recv(st.array, r, stream=self._stream).wait()
                    st.copy_out([o])
        else:
            with self._stage(t.dtype, t.numel(), [t]) as st:
                self.communicator.send(st.array, root, stream=self._stream).wait()
        return _done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> Any:
        """``scatter``: root's ``inputs[0][r]`` into rank r's ``outputs[0]`` (point to point)."""
        t = _one(outputs, "scatter output")
        root, me = int(opts.rootRank), self.rank()
        if me == root:
            ins = inputs[0]
            if len(ins) != self.size():
                raise ValueError(f"scatter needs a list of {self.size()} input tensors on the root")
            for r, x in enumerate(ins):
                check_tensor(x, f"scatter_list[{r}]")
                if r == me:
                    t.copy_(x)
                    continue
                with self._stage(x.dtype, x.numel(), [x]) as st:
                    self.communicator.send(st.array, r, stream=self._stream).wait()
        else:
            with self._stage(t.dtype, t.numel(), []) as st:
                self.communicator.recv(st.array, root, stream=self._stream).wait()
                st.copy_out([t])
        return _done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        """``barrier``: returns once every rank has called it."""
        self.communicator.barrier().wait()
        return _done([])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """``send``/``isend`` to group rank ``dst`` (hal orders messages FIFO per pair; ``tag`` is not matched)."""
        t = _one(tensors, "send tensor")
        with self._stage(t.dtype, t.numel(), [t]) as st:
            self.communicator.send(st.array, int(dst), stream=self._stream).wait()
        return _done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """``recv``/``irecv`` from group rank ``src`` (a source must be given)."""
        t = _one(tensors, "recv tensor")
        with self._stage(t.dtype, t.numel(), []) as st:
            self.communicator.recv(st.array, int(src), stream=self._stream).wait()
            st.copy_out([t])
        return _done(tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        """Not supported: hal.comm receives from a named rank."""
        raise ValueError("the 'hal' backend cannot receive from any source: pass src= to recv/irecv")


def create_process_group(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupHal:
    """The creator registered with ``torch.distributed.Backend.register_backend("hal", ...)``."""
    return ProcessGroupHal(store, rank, size, timeout)
