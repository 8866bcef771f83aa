#!/usr/bin/env python3
"""The reference safetensors package, for formats_safetensors_test.

  safetensors_reference.py write PATH   writes the tensors below with the reference writer
  safetensors_reference.py check PATH   loads PATH (a file) with the reference reader and prints
                                        what it holds as one JSON object on stdout

The values written must match ReferenceTensors() in safetensors_test.cc. Exit status 3 when
safetensors or numpy cannot be imported (the test then skips).
"""
import json
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import TensorSpec, serialize_file
    from safetensors.numpy import load_file
except ImportError as error:  # the test skips, with this reason
    print(f"cannot import the reference package: {error}", file=sys.stderr)
    sys.exit(3)


def reference_arrays():
    """Name -> (safetensors dtype name, numpy array of the stored bits)."""
    return {
        "model.embed.weight": ("F32", (np.arange(12, dtype=np.float32) * 0.25 - 1.0).reshape(3, 4)),
        "model.norm.bias": ("F16", np.array([1.0, -2.0, 65504.0, 2.0**-24, 1.0 / 3.0], dtype=np.float16)),
        # bfloat16 bits of 1, -2, pi (rounded), smallest subnormal, -0, +inf
        "model.layers.0.weight": ("BF16", np.array([0x3F80, 0xC000, 0x4049, 0x0001, 0x8000, 0x7F80],
                                                   dtype=np.uint16).reshape(2, 3)),
        "model.scale": ("F64", np.array(0.1, dtype=np.float64)),
        "step": ("I64", np.array([7, -1], dtype=np.int64)),
        "mask": ("U8", np.array([[1, 0], [0, 1]], dtype=np.uint8)),
        "empty": ("F32", np.zeros((0, 5), dtype=np.float32)),
    }


NUMPY_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
               "I64": "int64", "U8": "uint8"}


def write(path):
    arrays = reference_arrays()
    specs = {}
    for name, (dtype, array) in arrays.items():
        array = array.copy(order="C")  # (ascontiguousarray would make a scalar 1-D)
        specs[name] = TensorSpec(dtype=NUMPY_DTYPE[dtype], shape=array.shape,
                                 data_ptr=array.ctypes.data, data_len=array.nbytes)
    # One metadata key: the reference writes its metadata in hash order.
    serialize_file(specs, path, metadata={"format": "pt"})


def check(path):
    with open(path, "rb") as f:
        image = f.read()
    tensors = {}
    for name, info in safetensors.deserialize(image):
        tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"]),
                         "hex": bytes(info["data"]).hex()}
    with safetensors.safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
    # numpy has no bfloat16: load_file for files without it, as a user would.
    values = {}
    if all(t["dtype"] != "BF16" for t in tensors.values()):
        for name, array in load_file(path).items():
            values[name] = [float(x) for x in array.astype(np.float64).ravel()]
    print(json.dumps({"metadata": metadata, "tensors": tensors, "values": values}))


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        check(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
