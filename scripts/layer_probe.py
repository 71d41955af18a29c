"""Where a batch-1 decode layer's time goes, from timestamps taken inside its kernels' programs.

Runs the engine at batch 1 with CUDA graphs and the in-kernel probe on (LABKIT_DECODE_PROBE=1, set here before the
engine is imported; engine/kernels/probe.py), decodes --tokens tokens after a --prompt-len prompt, and reads the
timeline the last replayed decode graph left: for each kernel of each layer, when its programs started, had
their weights, passed the PDL wait, had their input, had their sums and ended. Printed for one layer (--layer)
and as medians over the middle layers, each time in microseconds after the previous kernel's last program ended
(its "end"), which is what the kernel costs the chain:

    python scripts/layer_probe.py --model /tmp/qwen3-fake [--json out.json]

The probe's stamps wait for the data they follow (a reduction each), so its layer is slower than the engine's;
the split between a kernel's phases is what it is for. CUDA only."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KERNELS = ("qkv", "attention", "o_proj", "gate_up", "down")


def layer_rows(rows: list[dict]) -> dict[int, list[dict]]:
    """The summarized launches of one pass grouped by layer ("L3 gate_up" -> layer 3), each row given "after":
    its points relative to the previous launch's last end (the first launch of the pass: to its own start)."""
    layers: dict[int, list[dict]] = {}
    prev_end = None
    for row in rows:
        layer, kernel = row["label"].split(" ", 1)
        base = prev_end if prev_end is not None else row["start"][0]
        after = {p: tuple(round(v - base, 3) for v in row[p]) for p in ("start", "loaded", "released", "input",
                                                                         "summed", "end")}
        layers.setdefault(int(layer[1:]), []).append({**row, "kernel": kernel, "after": after})
        prev_end = row["end"][2]
    return layers


def medians(layers: dict[int, list[dict]], skip: int = 1) -> list[dict]:
    """Per kernel, the median over layers skip..last-skip of each point's (first, median, last) after the previous
    kernel's end."""
    middle = [layers[i] for i in sorted(layers)[skip:len(layers) - skip]] or list(layers.values())
    out = []
    for j, kernel in enumerate(k["kernel"] for k in middle[0]):
        rows = [lr[j] for lr in middle if len(lr) > j and lr[j]["kernel"] == kernel]
        out.append({"kernel": kernel, "programs": rows[0]["programs"], "layers": len(rows),
                    "sms": statistics.median(r["sms"] for r in rows),
                    "phases": {p: round(statistics.median(r["phases"][p] for r in rows), 3) for p in rows[0]["phases"]},
                    "after": {p: tuple(round(statistics.median(r["after"][p][i] for r in rows), 3) for i in range(3))
                              for p in rows[0]["after"]}})
    return out


def table(rows: list[dict], title: str) -> str:
    """An 80-column table: each kernel's points after the previous kernel's end (first / last program, us)."""
    lines = [title, f"{'kernel':<10} {'progs':>5} {'start':>11} {'loaded':>11} {'released':>11} {'input':>7} "
             f"{'summed':>7} {'end':>11}"]
    for r in rows:
        a = r["after"]

        def span(p):
            return f"{a[p][0]:5.2f}/{a[p][2]:5.2f}"
        lines.append(f"{r['kernel']:<10} {r['programs']:>5} {span('start'):>11} {span('loaded'):>11} "
                     f"{span('released'):>11} {a['input'][2]:7.2f} {a['summed'][2]:7.2f} {span('end'):>11}")
    lines.append("(us after the previous kernel's end; first/last program; input, summed: last)")
    return "\n".join(lines)


PHASES = (("released>input", "wait>in"), ("input>new_kv", "in>kv"), ("new_kv>v_loaded", "kv>v"),
          ("v_loaded>tiles", "v>tiles"), ("tiles>summed", "t>sum"), ("summed>end", "sum>end"))


def phase_table(rows: list[dict]) -> str:
    """Each kernel's programs' own time from one point to the next after the wait (medians, us)."""
    lines = ["each program's own time after its wait (medians, us):",
             f"{'kernel':<10} {'SMs':>4} {'start>wait':>10}" + "".join(f" {short:>8}" for _, short in PHASES)]
    for r in rows:
        ph = r["phases"]
        before = ph["start>loaded"] + ph["loaded>released"]
        lines.append(f"{r['kernel']:<10} {r['sms']:>4.0f} {before:>10.2f}"
                     + "".join(f" {ph[p]:>8.2f}" for p, _ in PHASES))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layer", type=int, default=14)
    ap.add_argument("--json", help="write the pass's launches and the medians here")
    args = ap.parse_args(argv)
    os.environ["LABKIT_DECODE_PROBE"] = "1"
    import torch

    if not torch.cuda.is_available():
        print("layer_probe: needs CUDA (the probe reads the GPU's global timer)", file=sys.stderr)
        return 2
    from engine import LLM, SamplingParams
    from engine.kernels import probe

    llm = LLM(args.model, max_num_seqs=1, max_model_len=4096)
    prompt = list(range(100, 100 + args.prompt_len))
    llm.generate([prompt], SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.6), use_tqdm=False)
    torch.cuda.synchronize()
    passes = sorted({r.pass_id for r in probe.PROBE.regions})
    if not passes:
        print("layer_probe: no fused decode pass ran (is the fused path on?)", file=sys.stderr)
        return 1
    # the pass whose programs ended last: the decode graph replayed last
    last = max(passes, key=lambda p: max((s[5] for _, slots in probe.PROBE.read(p) for s in slots), default=0))
    rows = probe.summarize(probe.PROBE.read(last))
    layers = layer_rows(rows)
    mid = medians(layers)
    whole = [lr[-1]["end"][2] - lr[0]["start"][0] for lr in layers.values() if len(lr) == len(KERNELS)]
    stamps = sorted({s[i] for _, slots in probe.PROBE.read(last) for s in slots for i in range(6) if s[i] > 0})
    step = min((b - a for a, b in zip(stamps, stamps[1:])), default=0)
    print(f"{torch.cuda.get_device_name()}; pass {last} of {len(passes)}; {len(layers)} layers, {len(rows)} "
          f"launches; a layer {statistics.median(whole) if whole else 0:.2f} us (median: qkv's start to down's "
          f"end); the timer's smallest step {step} ns")
    print(table(mid, "medians over the middle layers:"))
    print(phase_table(mid))
    if args.layer in layers:
        print(table(layers[args.layer], f"layer {args.layer}:"))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "pass": last,
                                               "launches": rows, "medians": mid}, indent=1))
    llm.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
