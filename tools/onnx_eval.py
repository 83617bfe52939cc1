#!/usr/bin/python3
# Checks an ONNX file Loom wrote (`loom ckpt export --format onnx`) as a runtime would see it:
# onnx.checker with full (strict shape-inference) checks, then the logits for given tokens,
# from onnx's reference evaluator (onnx.reference, onnx >= 1.13) or, where the installed onnx
# has none (Debian 12's 1.12), from the graph evaluated node by node in numpy by each op's
# ONNX definition; compared with the logits Loom computed.
# Usage: tools/onnx_eval.py MODEL.onnx TOKENS.txt EXPECTED.f32 [TOLERANCE]
#   TOKENS.txt: "B T" then B x T token ids; EXPECTED.f32: B x T x V little-endian floats.
# Prints the evaluator and the largest difference; exit 0 when within TOLERANCE (1e-4).
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def layer_norm(x, w, b, axis=-1, epsilon=1e-5):
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * w + b


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


OPS = {
    "Shape": lambda a, x: np.array(x.shape, dtype=np.int64),
    "Gather": lambda a, x, i: np.take(x, i, axis=a.get("axis", 0)),
    "Squeeze": lambda a, x, axes=None: np.squeeze(x) if axes is None else np.squeeze(x, tuple(axes)),
    "Range": lambda a, s, l, d: np.arange(s, l, d, dtype=np.asarray(s).dtype),
    "Add": lambda a, x, y: x + y,
    "Mul": lambda a, x, y: x * y,
    "MatMul": lambda a, x, y: np.matmul(x, y),
    "Tanh": lambda a, x: np.tanh(x),
    "Concat": lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
    "Slice": lambda a, x, starts, ends: x[tuple(slice(s, e) for s, e in zip(starts, ends))],
    "LayerNormalization": lambda a, x, w, b: layer_norm(x, w, b, a.get("axis", -1), a.get("epsilon", 1e-5)),
    "Softmax": lambda a, x: softmax(x, a.get("axis", -1)),
    "Transpose": lambda a, x: np.transpose(x, a["perm"]),
    "Reshape": lambda a, x, s: x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(s)]),
    "Split": lambda a, x, sizes: np.split(x, np.cumsum(sizes)[:-1], axis=a.get("axis", 0)),
}


def evaluate(model, feeds):
    env = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    env.update(feeds)
    for node in model.graph.node:
        if node.op_type not in OPS:
            sys.exit(f"{node.op_type}: an op this evaluator does not know")
        out = OPS[node.op_type](attrs(node), *[env[i] for i in node.input])
        outs = out if node.op_type == "Split" else [out]
        for name, value in zip(node.output, outs):
            env[name] = np.asarray(value)
    return [env[o.name] for o in model.graph.output]


def main():
    path, tokens_path, expected_path = sys.argv[1:4]
    tolerance = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    words = open(tokens_path).read().split()
    b, t = int(words[0]), int(words[1])
    ids = np.array([int(w) for w in words[2:]], dtype=np.int64).reshape(b, t)
    try:
        from onnx.reference import ReferenceEvaluator
        logits, how = ReferenceEvaluator(model).run(None, {"input_ids": ids})[0], "onnx.reference"
    except ImportError:
        logits, how = evaluate(model, {"input_ids": ids})[0], f"numpy, onnx {onnx.__version__} has no onnx.reference"
    expected = np.fromfile(expected_path, dtype="<f4").reshape(logits.shape)
    diff = float(np.abs(logits.astype(np.float64) - expected).max())
    print(f"checker: ok; evaluator: {how}; logits {list(logits.shape)}; largest difference from Loom's {diff:.3g}")
    sys.exit(0 if diff <= tolerance else 1)


main()
