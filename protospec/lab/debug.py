"""Step through the draft loop: one spec step at a time, with every draft step's inputs recorded.

    dbg = DraftLoopDebugger(llm)              # an LLM with a speculative model
    dbg.add(prompts, SamplingParams(...))     # admit and prefill
    trace = dbg.spec_step()                   # one whole spec step; call again for the next
    # or stage by stage, stopping anywhere:
    dbg.begin(); d = dbg.draft_step()         # d.device_inputs, d.cpu_twin, d.differences
    dbg.draft_step(); ...; dbg.verify(); dbg.reject(); dbg.commit()
    trace.verdicts                            # per sequence and position: accepted / rejected / ...
    trace = dbg.commit(overlap=True)          # gpu mode: launch the next draft step 1 first (built on
    trace.next_first_step                     # the device), compared with its CPU twin after the commit;
                                              # the next begin() continues from it

For every draft step the debugger copies the device inputs to the host (a sync: debugging only) and
builds the CPU prepare_inputs twin from the host-side sequence state, so the GPU advance path and the
CPU reference path can be compared element by element after any step. `dbg.state` is the spec step's
live state (draft ids and probabilities so far, target probabilities after verify, the result).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protospec.config import SamplingParams
from protospec.model.inputs import prepare_inputs
from protospec.engine.llm import LLM
from protospec.layout import PLACEHOLDER_TOKEN_ID
from protospec.requests.sequence import Sequence
from protospec import registry

INPUT_FIELDS = ("input_ids", "positions", "seq_lens", "slot_mapping")


def _host_inputs(inputs) -> dict[str, torch.Tensor]:
    """Host copies (copy=True: on a CPU, .cpu() would alias the persistent buffers the next step changes)."""
    m = inputs.meta
    tensors = {"input_ids": inputs.input_ids, "positions": inputs.positions, "seq_lens": m.seq_lens,
               "slot_mapping": m.slot_mapping}
    return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}


@dataclass
class DraftStepTrace:
    step: int                               # 0-based draft step of the spec step
    path: str                               # "cpu_prepare" or "gpu_advance"
    device_inputs: dict[str, torch.Tensor]  # what the model read, copied to the host
    cpu_twin: dict[str, torch.Tensor]       # CPU prepare_inputs for the same step
    sampled_ids: list[int]

    @property
    def differences(self) -> dict[str, int]:
        """Elements that differ between the path that ran and its CPU twin, per field."""
        return {k: int((self.device_inputs[k] != self.cpu_twin[k]).sum()) for k in INPUT_FIELDS}


@dataclass
class SpecStepTrace:
    draft_steps: list[DraftStepTrace] = field(default_factory=list)
    verdicts: list[list[dict]] = field(default_factory=list)   # per sequence, per position
    written_slots: dict[str, list[int]] = field(default_factory=dict)  # model -> KV slots written
    block_tables: list[list[int]] = field(default_factory=list)         # per sequence, during the step
    counters: dict = field(default_factory=dict)
    next_first_step: DraftStepTrace | None = None  # commit(overlap=True): the next step's device-built draft step 1


def inputs_table(d: DraftStepTrace) -> str:
    """The step's device inputs next to their CPU twin, one line per field and sequence row."""
    lines = [f"draft step {d.step + 1} ({d.path}); differences {d.differences}",
             f"  {'field':<13}{'ran (device)':<28}{'CPU prepare twin':<28}"]
    for name in INPUT_FIELDS:
        lines.append(f"  {name:<13}{str(d.device_inputs[name].tolist()):<28}{str(d.cpu_twin[name].tolist()):<28}")
    return "\n".join(lines)


def verdict_lines(trace: SpecStepTrace, decode) -> str:
    """Per sequence: each position's draft token, the target's verdict, and what was emitted."""
    out = []
    for b, row in enumerate(trace.verdicts):
        out.append(f"sequence {b}:")
        for v in row:
            draft = "" if v["draft"] is None else repr(decode([v["draft"]])[0])
            emitted = "" if v["emitted"] == PLACEHOLDER_TOKEN_ID else repr(decode([v["emitted"]])[0])
            kind = f" ({v['kind']})" if "kind" in v else ""
            out.append(f"  pos {v['position']}: draft {draft:<14} {v['verdict']:<12} emitted {emitted}{kind}")
    return "\n".join(out)


class DraftLoopDebugger:
    def __init__(self, llm: LLM):
        if llm.engine.spec_step is None:
            raise ValueError("DraftLoopDebugger needs an LLM with a speculative model")
        self.llm, self.engine = llm, llm.engine
        self.seqs: list[Sequence] = []
        self._launched: DraftStepTrace | None = None  # draft step 1 launched by commit(overlap=True)

    def add(self, prompts, params: SamplingParams) -> list[Sequence]:
        """Admit prompts (text or ids) and prefill both models. Returns the live sequences."""
        eng = self.engine
        seqs = self.llm.make_sequences(prompts, params)
        eng.waiting.extend(seqs)
        self.seqs.extend(seqs)
        eng.admit_and_prefill(launch_first_step=False)  # stepping starts from a CPU-prepared draft step 1
        return self.seqs

    def decode(self, ids: list[int]) -> list[str]:
        tok = self.llm.tokenizer
        return [tok.decode([i]) if tok is not None else str(i) for i in ids]

    def _twin(self, step: int, seqs, tables, sampled_before) -> dict[str, torch.Tensor]:
        block_size = self.engine.config.block_size
        if step == 0:
            chunks = [s.token_ids[-2:] for s in seqs]
            starts = [s.num_tokens - 2 for s in seqs]
        else:
            chunks = [[t] for t in sampled_before]
            starts = [s.num_tokens - 1 + step for s in seqs]
        twin = prepare_inputs(chunks, starts, tables, block_size, 1, torch.device("cpu"))
        return _host_inputs(twin)

    # ---- stepping: begin -> draft_step (k times) -> verify -> reject -> commit --------------------
    def begin(self) -> SpecStepTrace:
        """Start a spec step for every running sequence (reserves lookahead slots)."""
        eng = self.engine
        seqs = list(eng.running)
        if not seqs:
            raise RuntimeError("no running sequence: add() prompts first (or all have finished)")
        launched, self._launched = self._launched, None
        if launched is None:
            # A step launched ahead by an overlapped commit inside engine.step() is set aside:
            # stepping by hand starts from draft step 1, so its inputs get compared with their twin.
            eng.spec_step.commit_policy.discard()
        self._counters_before = self.llm.counters
        self.state = eng.spec_step.begin(seqs, eng.sampling_tensors(seqs))
        bs, k = eng.config.block_size, eng.k
        self.trace = SpecStepTrace(block_tables=[list(seq.block_table) for seq in seqs])
        # Continuing from the launched step (its draft step 1, or in the graph mode its whole draft loop, ran).
        if launched is not None and self.state.first_inputs is not None:
            self.trace.draft_steps.append(launched)
        # Where the verify will write: positions L-1 .. L-1+k of every sequence.
        self.trace.written_slots["target"] = sorted(
            t[p // bs] * bs + p % bs for seq, t in zip(seqs, self.trace.block_tables) for p in range(seq.num_tokens - 1, seq.num_tokens + k))
        return self.trace

    def draft_step(self) -> DraftStepTrace | None:
        """Run the next draft step; returns its inputs next to their CPU twin (None for the graph
        mode's replay of steps 2..k, whose insides are not visible to the host)."""
        s, spec = self.state, self.engine.spec_step
        step = s.step
        inputs = spec.draft_step(s)
        if inputs is None:
            return None
        seqs, tables = s.seqs, [seq.block_table for seq in s.seqs]
        previous = s.draft_ids[:, step - 1].tolist() if step > 0 else []
        path = "gpu_advance" if step > 0 and spec.draft_loop.kind.on_device else "cpu_prepare"
        d = DraftStepTrace(step, path, _host_inputs(inputs), self._twin(step, seqs, tables, previous), s.draft_ids[:, step].tolist())
        self.trace.draft_steps.append(d)
        return d

    def verify(self) -> torch.Tensor:
        """The target's forward over the k+1 positions: its probabilities [B, k+1, V]."""
        while self.state.step < self.engine.k:  # finish the draft loop first
            self.draft_step()
        return self.engine.spec_step.verify(self.state)

    def reject(self) -> list[list[dict]]:
        """Rejection sampling; returns the verdicts per sequence and position."""
        if self.state.target_probs is None:
            self.verify()
        result = self.engine.spec_step.reject(self.state)
        self.trace.verdicts = self._verdicts(result)
        return self.trace.verdicts

    def commit(self, overlap: bool = False) -> SpecStepTrace:
        """Append the emitted tokens, roll the caches' lengths forward, free unused lookahead.
        overlap=True (gpu / graph modes): first launch the next step's draft step 1, built on the
        device from the rejection output, as generate() does; after the commit its inputs are
        compared with the CPU twin built from the committed state (trace.next_first_step)."""
        if self.state.result is None:
            self.reject()
        eng, spec = self.engine, self.engine.spec_step
        if overlap:
            if spec.commit_policy.name != registry.OVERLAPPED:
                raise ValueError(f"commit(overlap=True) needs the overlapped commit policy, which a device draft loop "
                                 f"has with overlap_commit on (draft loop {spec.draft_loop.name!r}, commit policy "
                                 f"{spec.commit_policy.name!r})")
            spec.queue_commit_copy(self.state)
            spec.commit_policy.launch_next(spec, self.state)
        spec.commit(self.state)
        eng.retire_finished()
        pending = spec.commit_policy.pending
        if pending is not None and any(seq.finished for seq in pending.seqs):
            # A request of the launched step ended in this commit: its table is freed, so its row has no
            # twin to compare with. Set aside; the next step starts from draft step 1 on the CPU.
            spec.commit_policy.discard()
            pending = None
        if pending is not None:
            seqs = pending.seqs
            self._launched = self.trace.next_first_step = DraftStepTrace(
                0, "gpu_first_step", _host_inputs(pending.first_inputs),
                self._twin(0, seqs, [seq.block_table for seq in seqs], []), pending.draft_ids[:, 0].tolist())
        self.trace.written_slots["draft"] = sorted(
            {int(x) for d in self.trace.draft_steps for x in d.device_inputs["slot_mapping"] if x >= 0})
        before = self._counters_before
        self.trace.counters = {name: {k: v - before.get(name, {}).get(k, 0) for k, v in now.items()
                                      if v != before.get(name, {}).get(k, 0)}
                               for name, now in self.llm.counters.items()}
        return self.trace

    def spec_step(self, overlap: bool = False) -> SpecStepTrace:
        """One whole spec step (all the stages above) for every running sequence."""
        self.begin()
        return self.commit(overlap)

    def _verdicts(self, result) -> list[list[dict]]:
        k = self.engine.k
        out_ids, num_accepted = result.output_token_ids.tolist(), result.num_accepted.tolist()
        all_drafted = self.state.draft_ids.tolist()
        rows = []
        for b, (emitted, accepted) in enumerate(zip(out_ids, num_accepted)):
            drafted = all_drafted[b]
            row = []
            for i in range(k + 1):
                if i < accepted:
                    row.append({"position": i, "draft": drafted[i], "verdict": "accepted", "emitted": emitted[i]})
                elif i == accepted:
                    kind = "bonus" if i == k else "recovered"
                    draft = drafted[i] if i < k else None
                    row.append({"position": i, "draft": draft, "verdict": "rejected" if i < k else "—",
                                "emitted": emitted[i], "kind": kind})
                else:
                    row.append({"position": i, "draft": drafted[i] if i < k else None, "verdict": "not reached",
                                "emitted": PLACEHOLDER_TOKEN_ID})
            rows.append(row)
        return rows
