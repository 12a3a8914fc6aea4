"""Step through the draft loop: one spec step at a time, with every draft step's inputs recorded.

    dbg = DraftLoopDebugger(llm)              # an LLM with a speculative model
    dbg.add(prompts, SamplingParams(...))     # admit and prefill
    trace = dbg.spec_step()                   # one spec step; call again for the next
    trace.draft_steps[2].device_inputs        # what the model read at draft step 3
    trace.draft_steps[2].cpu_twin             # what CPU prepare_inputs builds for the same step
    trace.verdicts                            # per sequence and position: accepted / rejected / ...

For every draft step the debugger copies the device inputs to the host (a sync: debugging only) and
builds the CPU prepare_inputs twin from the host-side sequence state, so the GPU advance path and the
CPU reference path can be compared element by element after any step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protospec.config import SamplingParams
from protospec.inputs import prepare_inputs
from protospec.llm import LLM
from protospec.rejection import PLACEHOLDER_TOKEN_ID
from protospec.sequence import Sequence

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

    def add(self, prompts, params: SamplingParams) -> list[Sequence]:
        """Admit prompts (text or ids) and prefill both models. Returns the live sequences."""
        eng = self.engine
        for prompt in self.llm._as_list(prompts):
            ids = self.llm._to_token_ids(prompt)
            self.llm._check_prompt(ids, params)
            seq = Sequence(self.llm._next_id, ids, params, eng.new_generator(params.seed, self.llm._rng), eng.eos_token_id)
            self.llm._next_id += 1
            eng.waiting.append(seq)
            self.seqs.append(seq)
        eng._prefill(eng._admit())
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

    def spec_step(self) -> SpecStepTrace:
        """Run one spec step for every running sequence and return what happened inside it."""
        eng, spec = self.engine, self.engine.spec_step
        seqs = list(eng.running)
        if not seqs:
            raise RuntimeError("no running sequence: add() prompts first (or all have finished)")
        trace = SpecStepTrace()
        before = {name: dict(r.counters) for name, r in (("target", eng.target), ("draft", eng.draft))}
        previous: list[int] = []
        block_size, k = eng.config.block_size, eng.k

        def record(step, inputs, ids, probs):
            ids_host = ids.tolist()
            path = "cpu_prepare" if step == 0 or spec.mode in ("main", "sampler") else "gpu_advance"
            tables = [s.block_table for s in seqs]
            if step == 0:  # lookahead is reserved now: where the verify will write k+1 tokens
                trace.block_tables = [list(t) for t in tables]
                trace.written_slots["target"] = sorted(
                    t[p // block_size] * block_size + p % block_size
                    for s, t in zip(seqs, tables) for p in range(s.num_tokens - 1, s.num_tokens + k))
            trace.draft_steps.append(DraftStepTrace(step, path, _host_inputs(inputs), self._twin(step, seqs, tables, previous), ids_host))
            previous[:] = ids_host

        spec.on_draft_step = record
        try:
            result = spec(seqs, eng._sampling_tensors(seqs))
        finally:
            spec.on_draft_step = None
        eng._retire_finished()
        trace.verdicts = self._verdicts(trace, result)
        trace.written_slots["draft"] = sorted({int(x) for d in trace.draft_steps for x in d.device_inputs["slot_mapping"] if x >= 0})
        trace.counters = {name: {k: v - before[name].get(k, 0) for k, v in r.counters.items() if v != before[name].get(k, 0)}
                          for name, r in (("target", eng.target), ("draft", eng.draft))}
        return trace

    def _verdicts(self, trace: SpecStepTrace, result) -> list[list[dict]]:
        k = self.engine.k
        out_ids, num_accepted = result.output_token_ids.tolist(), result.num_accepted.tolist()
        rows = []
        for b, (emitted, accepted) in enumerate(zip(out_ids, num_accepted)):
            drafted = [d.sampled_ids[b] for d in trace.draft_steps[:k]]
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
