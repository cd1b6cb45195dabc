"""``ProcessGroupHal``: a torch.distributed process group whose collectives run on hal.comm."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]
from torch.futures import Future

import hal
import hal.comm
from hal.comm._init import init_from_store
from hal.spi import setting
from hal.torch._tensors import as_hal, check_tensor, flat_cat, unpack

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
    name = str(getattr(reduce_op, "op", reduce_op)).rpartition(".")[
        2
    ]  # ReduceOp -> RedOpType.BXOR -> BXOR
    raise ValueError(
        f"reduce op {name} is not supported by the 'hal' backend (SUM, PRODUCT, MIN, MAX, AVG)"
    )


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
        raise ValueError(
            f"{what} takes one tensor per process with the 'hal' backend, got {len(tensors)}"
        )
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

    def __init__(
        self, store: Any, rank: int, size: int, timeout: timedelta, group_name: str = ""
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        if group_name:  # torch names the groups it registers (functional collectives look them up)
            self.setGroupName(group_name)
        timeout_ms = (  # HAL_COMM_TIMEOUT_MS, when set, wins over torch's default timeout
            None if setting("HAL_COMM_TIMEOUT_MS") is not None else timeout.total_seconds() * 1e3
        )
        # the n-th process group built on this store by this rank meets the n-th of the others;
        # the count lives in the store, so a destroyed-and-rebuilt default group gets fresh keys
        instance = int(store.add(f"hal/instances/{rank}", 1))
        cpu = hal.devices("cpu")
        local = int(os.environ.get("LOCAL_RANK", rank))
        self.communicator = init_from_store(
            store,
            rank,
            size,
            prefix=f"hal/{instance}",
            device=cpu[local % len(cpu)],
            timeout_ms=timeout_ms,
        )
        self._device = self.communicator.device
        self._stream = self._device.create_stream()

    # -- identity -------------------------------------------------------------------------
    def getBackendName(self) -> str:
        """``"hal"``."""
        return "hal"

    # torch keeps a group's name in its C++ backends, which a Python process group has none
    # of: these overrides of the trampolined C++ methods hold it (pg.group_name, the registry)
    _hal_group_name = ""

    def getGroupName(self) -> str:
        """The name torch gave this group (``pg.group_name``)."""
        return self._hal_group_name

    def setGroupName(self, name: str) -> None:
        """Set by torch when it registers the group."""
        self._hal_group_name = str(name)

    def shutdown(self) -> None:
        """Close the hal communicator (``destroy_process_group``)."""
        self.communicator.close()

    def abort(self) -> None:
        """Abort the hal communicator: running calls fail at once."""
        self.communicator.abort()

    # -- helpers --------------------------------------------------------------------------
    def _h(self, t: torch.Tensor) -> hal.Array:
        return as_hal(t, self._device)

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        """``all_reduce``: reduce ``tensors[0]`` in place across ranks (zero-copy)."""
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        t = _one(tensors, "all_reduce tensor")
        self.communicator.all_reduce(self._h(t), op=op, stream=self._stream).wait()
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``all_reduce_coalesced``: one all_reduce over the tensors' concatenation."""
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not tensors:
            return _done(tensors)
        flat = flat_cat(tensors, _same_dtype(tensors, "tensors"))
        self.communicator.all_reduce(self._h(flat), op=op, stream=self._stream).wait()
        unpack(flat, tensors)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:  # type: ignore[override]
        """``broadcast``: root's ``tensors[0]`` to every rank (zero-copy)."""
        t = _one(tensors, "broadcast tensor")
        self.communicator.broadcast(self._h(t), root=int(opts.rootRank), stream=self._stream).wait()
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:  # type: ignore[override]
        """``reduce``: the reduction lands in root's ``tensors[0]``; the others' are left unchanged."""
        t = _one(tensors, "reduce tensor")
        op, root = _op(opts.reduceOp), int(opts.rootRank)
        self.communicator.reduce(self._h(t), op=op, root=root, stream=self._stream).wait()
        return _done(tensors)

    def allgather(  # type: ignore[override]
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """``all_gather``: every rank's ``inputs[0]`` into ``outputs[0][r]``."""
        t = _one(inputs, "all_gather input")
        if len(outputs) != 1 or len(outputs[0]) != self.size():
            raise ValueError(f"all_gather needs a list of {self.size()} output tensors")
        outs = outputs[0]
        for i, o in enumerate(outs):
            check_tensor(o, f"tensor_list[{i}]")
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(
                    f"tensor_list[{i}] ({o.numel()} x {o.dtype}) differs from the input ({t.numel()} x {t.dtype})"
                )
        flat = torch.empty(t.numel() * self.size(), dtype=t.dtype)
        self.communicator.all_gather(self._h(t), self._h(flat), stream=self._stream).wait()
        unpack(flat, outs)
        return _done(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        """``all_gather_into_tensor``: every rank's ``input`` concatenated into ``output`` (zero-copy)."""
        check_tensor(input, "input_tensor")
        check_tensor(output, "output_tensor")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"output_tensor ({output.numel()} x {output.dtype}) must hold {self.size()} x the input "
                f"({input.numel()} x {input.dtype})"
            )
        self.communicator.all_gather(self._h(input), self._h(output), stream=self._stream).wait()
        return _done([output])

    _allgather_base = all_gather_single

    def reduce_scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        """``reduce_scatter``: reduce ``inputs[0][r]`` across ranks into rank r's ``outputs[0]``."""
        out = _one(outputs, "reduce_scatter output")
        if len(inputs) != 1 or len(inputs[0]) != self.size():
            raise ValueError(f"reduce_scatter needs a list of {self.size()} input tensors")
        ins = inputs[0]
        for i, x in enumerate(ins):
            check_tensor(x, f"input_list[{i}]")
            if x.numel() != out.numel() or x.dtype != out.dtype:
                raise ValueError(
                    f"input_list[{i}] ({x.numel()} x {x.dtype}) differs from the output ({out.numel()} x {out.dtype})"
                )
        flat = flat_cat(ins, out.dtype)
        self.communicator.reduce_scatter(
            self._h(flat), self._h(out), op=_op(opts.reduceOp), stream=self._stream
        ).wait()
        return _done([out])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        """``reduce_scatter_tensor``: reduce ``input`` across ranks; segment ``rank`` lands in
        ``output`` (zero-copy)."""
        check_tensor(output, "output")
        check_tensor(input, "input")
        if input.numel() != output.numel() * self.size() or input.dtype != output.dtype:
            raise ValueError(
                f"input ({input.numel()} x {input.dtype}) must hold {self.size()} x the output "
                f"({output.numel()} x {output.dtype})"
            )
        self.communicator.reduce_scatter(
            self._h(input), self._h(output), op=_op(opts.reduceOp), stream=self._stream
        ).wait()
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any = None,
    ) -> Any:
        """``all_to_all_single``: block i of ``input`` to rank i (even splits zero-copy; uneven padded)."""
        check_tensor(input, "input")
        check_tensor(output, "output")
        size = self.size()
        row_in = input[0].numel() if input.dim() and input.shape[0] else 1
        row_out = output[0].numel() if output.dim() and output.shape[0] else 1
        ins = [s * row_in for s in in_splits] if in_splits else [input.numel() // size] * size
        outs = [s * row_out for s in out_splits] if out_splits else [output.numel() // size] * size
        if (
            len(ins) != size
            or len(outs) != size
            or sum(ins) != input.numel()
            or sum(outs) != output.numel()
        ):
            raise ValueError(
                f"all_to_all_single: splits {in_splits}/{out_splits} do not cut the tensors into {size} blocks"
            )
        self._all_to_all(output.view(-1), input.reshape(-1), outs, ins)
        return _done([output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        """``all_to_all``: ``inputs[i]`` to rank i, rank i's block into ``outputs[i]``."""
        size = self.size()
        if len(inputs) != size or len(outputs) != size:
            raise ValueError(f"all_to_all needs {size} input and {size} output tensors")
        dt = _same_dtype(list(inputs) + list(outputs), "tensors")
        out = torch.empty(sum(t.numel() for t in outputs), dtype=dt)
        self._all_to_all(
            out, flat_cat(inputs, dt), [t.numel() for t in outputs], [t.numel() for t in inputs]
        )
        unpack(out, outputs)
        return _done(outputs)

    def _all_to_all(
        self, output: torch.Tensor, input: torch.Tensor, outs: list[int], ins: list[int]
    ) -> None:
        size = self.size()
        if len(set(ins)) == 1 and len(set(outs)) == 1 and ins[0] == outs[0]:
            self.communicator.all_to_all(
                self._h(input), self._h(output), stream=self._stream
            ).wait()
            return
        # uneven blocks: agree on the largest block, pad every block to it, one all_to_all
        big = torch.tensor([max(ins + outs)], dtype=torch.int64)
        self.communicator.all_reduce(self._h(big), op="max", stream=self._stream).wait()
        block = int(big[0])
        src = torch.zeros(size * block, dtype=input.dtype)
        off = 0
        for i, n in enumerate(ins):
            src[i * block : i * block + n] = input[off : off + n]
            off += n
        dst = torch.empty_like(src)
        self.communicator.all_to_all(self._h(src), self._h(dst), stream=self._stream).wait()
        off = 0
        for i, n in enumerate(outs):
            output[off : off + n] = dst[i * block : i * block + n]
            off += n

    def gather(  # type: ignore[override]
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> Any:
        """``gather``: every rank's ``inputs[0]`` into root's ``outputs[0][r]`` (point to point, zero-copy)."""
        t = _one(inputs, "gather input")
        root, me = int(opts.rootRank), self.rank()
        if me == root:
            outs = outputs[0]
            if len(outs) != self.size():
                raise ValueError(f"gather needs a list of {self.size()} output tensors on the root")
            works = []
            for r, o in enumerate(outs):
                check_tensor(o, f"gather_list[{r}]")
                if r == me:
                    o.copy_(t)
                else:
                    works.append(self.communicator.irecv(self._h(o), r, stream=self._stream))
            for w in works:
                w.wait()
        else:
            self.communicator.isend(self._h(t), root, stream=self._stream).wait()
        return _done(outputs)

    def scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> Any:
        """``scatter``: root's ``inputs[0][r]`` into rank r's ``outputs[0]`` (point to point, zero-copy)."""
        t = _one(outputs, "scatter output")
        root, me = int(opts.rootRank), self.rank()
        if me == root:
            ins = inputs[0]
            if len(ins) != self.size():
                raise ValueError(f"scatter needs a list of {self.size()} input tensors on the root")
            works = []
            for r, x in enumerate(ins):
                check_tensor(x, f"scatter_list[{r}]")
                if r == me:
                    t.copy_(x)
                else:
                    works.append(self.communicator.isend(self._h(x), r, stream=self._stream))
            for w in works:
                w.wait()
        else:
            self.communicator.irecv(self._h(t), root, stream=self._stream).wait()
        return _done(outputs)

    def barrier(self, opts: Any = None) -> Any:
        """``barrier``: returns once every rank has called it."""
        self.communicator.barrier().wait()
        return _done([])

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """``send``/``isend`` to group rank ``dst``: returns at once; ``wait()`` once the tensor may be reused."""
        t = _one(tensors, "send tensor")
        return _P2PWork(
            self.communicator.isend(self._h(t), int(dst), tag=int(tag), stream=self._stream),
            tensors,
        )

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """``recv``/``irecv`` from group rank ``src`` (a source must be given): returns at once."""
        t = _one(tensors, "recv tensor")
        return _P2PWork(
            self.communicator.irecv(self._h(t), int(src), tag=int(tag), stream=self._stream),
            tensors,
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        """Not supported: hal.comm receives from a named rank."""
        raise ValueError(
            "the 'hal' backend cannot receive from any source: pass src= to recv/irecv"
        )


class _P2PWork(dist._Work):
    """A torch ``Work`` over a hal point-to-point ``Work`` (``isend``/``irecv`` progress together)."""

    def __init__(self, work: hal.comm.Work, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self._work = work
        self._tensors = tensors

    def wait(self, timeout: Any = None) -> bool:
        """Block until the transfer is done; raise its error (hal.CommError)."""
        self._work.wait()
        return True

    def is_completed(self) -> bool:
        """True once the transfer is done."""
        return bool(self._work.done())

    def is_success(self) -> bool:
        """True once the transfer is done without error."""
        if not self._work.done():
            return False
        try:
            self._work.wait()
        except Exception:
            return False
        return True

    def get_future(self) -> Any:
        """A future holding the tensors (waits for the transfer first)."""
        self.wait()
        fut: Future[Any] = Future()
        fut.set_result(self._tensors)
        return fut

    def result(self) -> list[torch.Tensor]:
        """The tensors sent or received into."""
        return self._tensors


def create_process_group(opts: Any, backend_options: Any = None) -> ProcessGroupHal:
    """The creator registered with ``Backend.register_backend("hal", ..., extended_api=True)``.

    ``opts`` is torch's ``_DistributedBackendOptions``: the group's (prefixed) store, this
    rank in the group, the group size, the timeout and the group's name.
    """
    return ProcessGroupHal(
        opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id)
    )
