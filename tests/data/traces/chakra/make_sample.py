#!/usr/bin/env python3
"""Writes sample.<rank>.et and sample.comm_groups.json: a 2-rank data-parallel Chakra trace made
independently of stratasim's exporter. Each message is written in protobuf text format and
encoded by `protoc --encode` against traces/et_def.proto; the length prefix is the varint32 that
Chakra's encode_message writes. Run from anywhere: python3 make_sample.py

Per rank: a METADATA node (skipped on import), a forward GEMM (100 us), a backward GEMM
(200 us, data dependency on the forward), an all-reduce of 1 MiB gradients on process group "0"
(ranks 0 and 1) and an optimizer step (50 us) after it. Rank 1's file lists its nodes out of
order (the optimizer first) so that the importer must sort them.
"""
import pathlib
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[3]
PROTO = ROOT / "traces" / "et_def.proto"


def encode(message_type: str, text: str) -> bytes:
    body = subprocess.run(
        ["protoc", f"--encode=ChakraProtoMsg.{message_type}", f"-I{PROTO.parent}", PROTO.name],
        input=text.encode(), capture_output=True, check=True, cwd=PROTO.parent).stdout
    n, prefix = len(body), bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        prefix.append(b | (0x80 if n else 0))
        if not n:
            return bytes(prefix) + body


METADATA = 'version: "0.0.4"\nattr { name: "schema" string_val: "1.0.2-chakra.0.0.4" }\n'

NODES = {
    0: 'id: 0 name: "[pytorch|profiler|execution_trace|process]" type: METADATA_NODE',
    1: ('id: 1 name: "aten::mm (forward)" type: COMP_NODE ctrl_deps: 0 duration_micros: 100 '
        'attr { name: "is_cpu_op" bool_val: false } '
        'attr { name: "num_ops" int64_val: 68719476736 } '
        'attr { name: "tensor_size" uint64_val: 25165824 }'),
    2: ('id: 2 name: "aten::mm (backward)" type: COMP_NODE data_deps: 1 duration_micros: 200 '
        'attr { name: "is_cpu_op" bool_val: false }'),
    3: ('id: 3 name: "nccl:all_reduce" type: COMM_COLL_NODE data_deps: 2 '
        'attr { name: "is_cpu_op" bool_val: false } '
        'attr { name: "comm_type" int64_val: 0 } '
        'attr { name: "comm_size" int64_val: 1048576 } '
        'attr { name: "pg_name" string_val: "0" }'),
    4: ('id: 4 name: "optimizer.step" type: COMP_NODE data_deps: 3 duration_micros: 50 '
        'attr { name: "is_cpu_op" bool_val: false }'),
}


def main() -> None:
    for rank, order in ((0, [0, 1, 2, 3, 4]), (1, [4, 0, 3, 1, 2])):
        data = encode("GlobalMetadata", METADATA)
        for i in order:
            data += encode("Node", NODES[i])
        (HERE / f"sample.{rank}.et").write_bytes(data)
    (HERE / "sample.comm_groups.json").write_text('{"0": [0, 1]}\n')


if __name__ == "__main__":
    main()
