#!/usr/bin/env python3
"""Writes custom_allreduce.<rank>.et for 8 ranks: the Chakra trace of an MSCCL-style ring
all-reduce of 1 MB built from COMM_SEND_NODE / COMM_RECV_NODE, node for node as ASTRA-sim's
examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB has it (see PROVENANCE.md):
the same node ids, names, types, attributes and data dependencies. Only the GlobalMetadata's
"input_file" attribute (the 27 KB MSCCL XML the example was made from) is left out.

Rank r's thread block sends to rank r+1 and receives from rank r-1 (mod 8), one 131072-byte
chunk (1 MiB / 8) per step: step 0 sends; the 7 reduce-scatter steps receive, reduce (a 7 us
COMP_NODE) and send on; the all-gather steps receive and send on; the last step receives.
Every node has a data dependency on the one before it, so each receive depends on its own
rank's send: a send must not wait for its receive (Chakra's and ASTRA-sim's semantics) or the
ring deadlocks.

Each message is encoded by `protoc --encode` against traces/et_def.proto, with the varint32
length prefix that Chakra's encode_message writes. Run from anywhere: python3 make_ring.py
"""
import pathlib
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[4]
PROTO = ROOT / "traces" / "et_def.proto"
RANKS = 8
CHUNK = 131072  # 1 MiB / 8 ranks
REDUCE_US = 7


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


METADATA = ('attr { name: "schema" string_val: "1.0.2-chakra.0.0.4" } '
            'attr { name: "collective" string_val: "allreduce" }')


def comm(node_id: int, kind: str, step: int, peer: int) -> str:
    send = kind == "SEND"
    deps = f" data_deps: {node_id - 1}" if node_id > 0 else ""
    return (f'id: {node_id} name: "COMM_{kind}_NODE_tb0_step{step}" type: COMM_{kind}_NODE{deps} '
            f'attr {{ name: "comm_type" int64_val: {5 if send else 6} }} '
            f'attr {{ name: "comm_size" int64_val: {CHUNK} }} '
            f'attr {{ name: "{"comm_dst" if send else "comm_src"}" int32_val: {peer} }} '
            f'attr {{ name: "comm_tag" int32_val: 0 }}')


def rank_nodes(rank: int) -> list:
    nxt, prev = (rank + 1) % RANKS, (rank - 1) % RANKS
    nodes = []
    for step in range(4 * (RANKS - 1)):
        if step % 2 == 0:
            nodes.append(comm(len(nodes), "SEND", step, nxt))
        else:
            nodes.append(comm(len(nodes), "RECV", step, prev))
            if step < 2 * RANKS - 1:  # reduce-scatter: reduce what arrived
                i = len(nodes)
                nodes.append(f'id: {i} name: "COMP_NODE_tb0_step{step}" type: COMP_NODE '
                             f'data_deps: {i - 1} duration_micros: {REDUCE_US}')
    return nodes


def main() -> None:
    for rank in range(RANKS):
        data = encode("GlobalMetadata", METADATA)
        for node in rank_nodes(rank):
            data += encode("Node", node)
        (HERE / f"custom_allreduce.{rank}.et").write_bytes(data)


if __name__ == "__main__":
    main()
