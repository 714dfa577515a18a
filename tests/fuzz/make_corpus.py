#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus/: for each target a few valid
inputs and near misses, in the formats its source file describes. Inputs
that libFuzzer found and that are worth keeping are added to the same
folders by hand (docs/RELIABILITY.md, "Fuzzing"); this script leaves files
it did not write alone.

  make_corpus.py [CORPUS_DIR]   (default: the corpus folder next to it)
"""
import pathlib
import struct
import sys

ROOT = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "corpus"

SECRET = bytes(range(16))
TOPOLOGY = ("T2 node-a node-a/5f1c2e 4242 0 0-3,8 7 2 "
            "g,0000:3b:00.0,10de,2330,0,~,~,GPU-5f1c2e00-aaaa-bbbb-cccc-0123456789ab "
            "i,0000:5e:00.0,15b3,1017,0,ib0,mlx5_0,~")
# The settings line of a card (src/agreed_settings.h): entries apart by 0x1f.
SETTINGS = "\x1f".join(["BRAID_CHUNK_BYTES=524288", "BRAID_ALGO=(unset)", "BRAID_TUNE=model"])


def write(target, name, data):
    folder = ROOT / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def string(s):
    s = s.encode() if isinstance(s, str) else s
    return u32(len(s)) + s


# ---- unique_id: 128 bytes, then a byte choosing nranks and rank ----
def unique_id(address, magic=b"BRD1", length=None, tail=b""):
    text = address.encode() if isinstance(address, str) else address
    out = bytearray(128)
    out[0:4] = magic
    out[4] = len(text) if length is None else length
    out[8:24] = SECRET
    out[24:24 + len(text)] = text[:104]
    return bytes(out) + tail


write("unique_id", "ipv4", unique_id("127.0.0.1:29500"))
write("unique_id", "ipv6", unique_id("[::1]:29500"))
write("unique_id", "bad_magic", unique_id("127.0.0.1:29500", magic=b"NCCL", tail=b"\x13"))
write("unique_id", "zero_length", unique_id("127.0.0.1:29500", length=0))
write("unique_id", "long_length", unique_id("127.0.0.1:29500", length=200))
write("unique_id", "host_name", unique_id("localhost:29500", tail=b"\x2a"))
write("unique_id", "nul_in_address", unique_id(b"127.0.0.1\x00x:29500"))
write("unique_id", "no_port", unique_id("127.0.0.1"))
write("unique_id", "port_too_large", unique_id("127.0.0.1:70000"))
write("unique_id", "ipv6_unclosed", unique_id("[::1:29500"))
write("unique_id", "zeros", bytes(128))

# ---- rendezvous: a mode byte, then what that side reads ----
proof = struct.pack("<IIi", 0x62726169, 1, 2) + bytes(16) + bytes(32)
write("rendezvous", "greet_wrong_mac", b"\x00" + proof + u32(4) + string("127.0.0.1:4000"))
write("rendezvous", "greet_wrong_purpose", b"\x00" + proof[:4] + u32(2) + proof[8:])
write("rendezvous", "greet_truncated", b"\x00" + proof[:30])
published = "127.0.0.1:4000\n" + SETTINGS + "\n" + TOPOLOGY
write("rendezvous", "join", b"\x01" + u32(4) + string(published))
write("rendezvous", "join_long", b"\x01" + u32(2) + string("127.0.0.1:4000\n" + SETTINGS + "\nT2 " + "h" * 1000 +
                                                              " h 1 0 ~ 7 0"))
write("rendezvous", "join_length_too_large", b"\x01" + u32(2) + u32(0xFFFFFFF0) + b"x" * 8)
write("rendezvous", "join_truncated", b"\x01" + u32(2) + u32(100) + b"127.0")
write("rendezvous", "connect_side", b"\x02" + bytes(16) + bytes(32))
cards = [f"127.0.0.{r + 1}:400{r}\n" + SETTINGS + "\n" + TOPOLOGY.replace("4242", str(4242 + r)) for r in range(3)]
write("rendezvous", "answer_table", b"\x03\x02" + u32(0) + b"".join(string(c) for c in cards))
write("rendezvous", "answer_bad_card", b"\x03\x01" + u32(0) + string("127.0.0.1:4000") +
      string("no topology"))
write("rendezvous", "answer_host_name", b"\x03\x00" + u32(0) + string("localhost:4000\n" + SETTINGS + "\n" + TOPOLOGY))
write("rendezvous", "answer_refused", b"\x03\x03" + u32(4) + string("rank 1 joined twice"))
write("rendezvous", "answer_unknown_code", b"\x03\x03" + u32(256) + string("?"))
write("rendezvous", "answer_truncated", b"\x03\x03" + u32(0) + string(cards[0]) + u32(50))


def joins(*pairs):
    return b"\x04" + b"".join(struct.pack("<iI", r, n & 0xFFFFFFFF) for r, n in pairs)


write("rendezvous", "admit_complete", joins((1, 3), (0, 3), (2, 3)))
write("rendezvous", "admit_twice", joins((0, 2), (0, 2)))
write("rendezvous", "admit_disagree", joins((0, 2), (1, 3)))
write("rendezvous", "admit_out_of_range", joins((-1, 2), (5, 2), (0, 0), (0, 0xFFFFFFFF)))

# ---- stream_connection: an options byte, then commands ----
def frame(channel, k, check, size, kind=0):
    return bytes([2, channel]) + struct.pack("<HBIB", k, check, size, kind)


def recv(channel, k, check, size, op=3, unit=None):
    out = bytes([op, channel]) + struct.pack("<HBI", k, check, size)
    return out + (bytes([unit]) if unit is not None else b"")


def data(payload):
    return b"\x00" + struct.pack("<H", len(payload)) + payload


def fill(n, b):
    return b"\x01" + struct.pack("<IB", n, b)


PROGRESS = b"\x06"
write("stream_connection", "posted_first",
      b"\x00" + recv(0, 1, 7, 8) + frame(0, 1, 7, 8) + data(bytes(range(8))) + PROGRESS)
write("stream_connection", "unexpected_then_posted",
      b"\x00" + frame(0, 2, 7, 12) + data(b"x" * 12) + PROGRESS + recv(0, 2, 7, 12) + PROGRESS)
write("stream_connection", "in_small_reads",
      b"\x00" + b"\x0c\x03\x00" + recv(0, 1, 7, 300) + frame(0, 1, 7, 300) + fill(300, 9) +
      PROGRESS * 4)
write("stream_connection", "reduce_after_odd_frame",
      b"\x00" + recv(0, 1, 7, 3) + recv(0, 2, 7, 4000, op=4, unit=2) + frame(0, 1, 7, 3) +
      data(b"abc") + frame(0, 2, 7, 4000) + fill(4000, 5) + PROGRESS)
write("stream_connection", "large_direct",
      b"\x00" + recv(1, 5, 9, 100000) + frame(1, 5, 9, 100000) + fill(100000, 1) + PROGRESS)
write("stream_connection", "large_unexpected",
      b"\x00" + frame(1, 5, 9, 100000) + fill(100000, 1) + PROGRESS + recv(1, 5, 9, 100000))
write("stream_connection", "mismatch_and_overtake",
      b"\x00" + recv(0, 1, 7, 8) + recv(0, 3, 7, 8) + frame(0, 2, 7, 8) + data(b"y" * 8) +
      frame(0, 3, 8, 8) + data(b"z" * 8) + PROGRESS + b"\x08\x00" + struct.pack("<Q", 1 << 40))
write("stream_connection", "goodbye",
      b"\x00" + recv(0, 1, 7, 8) + frame(0, 0, 4, 11, kind=3) + data(b"a mismatch!") + PROGRESS)
write("stream_connection", "goodbye_too_long",
      b"\x00" + frame(0, 0, 5, 5000, kind=3) + fill(5000, 0x41) + PROGRESS)
write("stream_connection", "descriptor_posted",
      b"\x01" + recv(0, 16, 7, 4096) + frame(0, 16, 7, 4096, kind=1) + PROGRESS * 2)
write("stream_connection", "descriptor_reduce",
      b"\x01" + recv(0, 16, 7, 300000, op=4, unit=8) + frame(0, 16, 7, 300000, kind=1) +
      PROGRESS * 2)
write("stream_connection", "descriptor_unclaimed",
      b"\x05" + frame(0, 16, 7, 4096, kind=1) + PROGRESS + b"\x07" + recv(0, 16, 7, 4096))
write("stream_connection", "descriptor_out_of_range",
      b"\x01" + recv(0, 16, 7, 2 << 20) + frame(0, 16, 7, 2 << 20, kind=1) + PROGRESS)
write("stream_connection", "descriptor_on_tcp",
      b"\x00" + recv(0, 16, 7, 4096) + frame(0, 16, 7, 4096, kind=1) + PROGRESS)
write("stream_connection", "sends_and_ack",
      b"\x03" + recv(0, 1, 7, 64, op=5) + b"\x0b\x10\x00" + recv(0, 2, 7, 100, op=5) + PROGRESS +
      b"\x0b\xff\xff" + PROGRESS + frame(0, 1, 0, 0, kind=2) + PROGRESS + b"\x07")
write("stream_connection", "peer_closes",
      b"\x00" + recv(0, 1, 7, 8) + frame(0, 1, 7, 8) + data(b"1234") + b"\x09" + PROGRESS)
write("stream_connection", "abort",
      b"\x00" + recv(0, 1, 7, 8) + recv(0, 1, 7, 8, op=5) + b"\x0a" + PROGRESS + recv(0, 2, 7, 8))
write("stream_connection", "huge_frame",
      b"\x00" + frame(0, 1, 7, 0xFFFFFFFF) + fill(1000, 3) + PROGRESS + b"\x09" + PROGRESS)
write("stream_connection", "huge_frame_raw",
      b"\x00" + data(struct.pack("<QQQQ", 5, 7, 1 << 62, 0) + b"q" * 64) + PROGRESS)
write("stream_connection", "huge_descriptor",
      b"\x05" + data(struct.pack("<QQQQ", 5, 7, 1 << 62, 0x7E0000000000)) + PROGRESS + b"\x07")

# ---- topology: BRAID_TRANSPORT, then one encoded description per line ----
write("topology", "two_hosts",
      "\n" + TOPOLOGY + "\n" + TOPOLOGY.replace("4242", "4243").replace("0-3,8", "16-19") + "\n" +
      "T2 node-b node-b/77aa 1 1 ~ 3 1 e,0000:01:00.0,8086,1572,-1,eth0,~,~\n")
write("topology", "forced_shm", "shm\n" + TOPOLOGY + "\nT2 node-b node-b/77aa 1 -1 ~ 7 0\n")
write("topology", "forced_unknown", "ib\n" + TOPOLOGY + "\n" + TOPOLOGY + "\n")
write("topology", "escaped", "\nT2 h%20a%25 ~ 0 -1 0 0 0\nT2 h%20a%25 ~ 1 -1 0 0 0\x00\x00\x00\n")
write("topology", "near_misses",
      "tcp\nT2 h h 1 0 0 7 0 extra\nT2 h h 1 0 0-999999999 7 0\nT2 h h 1 0 0 7 99999999999\n"
      "T2 h h 1 0 0 7 1 g,bus,zzzz,0,0,~,~\nT2 h%4 h 1 0 0 7 0\nT2 h h 1 0 0 7 0\n")

# ---- topology_json: BRAID_TOPO_FILE contents ----
write("topology_json", "array", """[
  {"hostname": "node-a", "numa_node": 0, "cores": "0-15",
   "devices": [{"kind": "gpu", "bus_id": "0000:3b:00.0", "vendor": "0x10de", "numa_node": 0},
               {"kind": "ib", "bus_id": "0000:5e:00.0", "ib": ["mlx5_0"], "net": ["ib0"]}]},
  {"hostname": "node-a", "numa_node": 1, "cores": "16-31"},
  {"hostname": "node-b", "numa_node": 0, "cores": "0-15", "devices": [{"kind": "ib"}]}
]
""")
write("topology_json", "ranks_object",
      '{"ranks": [{"rank": 0, "host_id": "x", "pid": 7, "cores": [0, 1, 2, 5],'
      ' "transports": ["shm", "tcp"]}, {"rank": 1, "host_id": "x", "transports": []}]}')
write("topology_json", "shared", '{"hostname": "solo", "devices": [{"kind": "eth", "net": ["eth0"],'
      ' "vendor": 32902, "device": "1572"}]}')
write("topology_json", "near_misses",
      '[{"hostname": "a", "colour": 1}, {"rank": 3, "hostname": "b"}, {"pid": -4},'
      ' {"hostname": "c", "devices": [{"kind": "tpu"}]}, {"hostname": 7}]')
write("topology_json", "escapes", '[{"hostname": "a\\u0000b \\u00e9", "host_id": "~%+, "}]')

# ---- env: NAME=VALUE lines ----
write("env", "all_set", "\n".join([
    "BRAID_DEBUG=info", "BRAID_TIMEOUT=30.5", "BRAID_TRANSPORT=tcp", "BRAID_TUNE=measure",
    "BRAID_ALGO=allreduce=ring,broadcast=tree", "BRAID_SOCKET_IFNAME=eth0",
    "BRAID_SHM_BYTES=65536", "BRAID_SHM_CMA_BYTES=0", "BRAID_HOSTID=rack1-node7",
    "BRAID_CHUNK_BYTES=1048576", "BRAID_SPIN_US=auto", "BRAID_LINK_ALPHA_US=12",
    "BRAID_LINK_GBPS=10", "BRAID_REDUCE_GBPS=5", "BRAID_RANK=1", "BRAID_WORLD_SIZE=4",
    "BRAID_ADDR=127.0.0.1:29500", "BRAID_SECRET=00112233445566778899aabbccddeeff"]))
write("env", "torchrun", "RANK=0\nWORLD_SIZE=2\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=29500\n")
write("env", "mpi_partial", "OMPI_COMM_WORLD_RANK=3\nMASTER_ADDR=::1\nMASTER_PORT=1\n")
write("env", "slurm_ipv6", "SLURM_PROCID=0\nSLURM_NTASKS=1\nBRAID_ADDR=[::1]:80\n")
write("env", "bad_values", "\n".join([
    "BRAID_TIMEOUT=nan", "BRAID_SHM_BYTES=4097", "BRAID_CHUNK_BYTES=1e99",
    "BRAID_ALGO=allreduce=,=ring", "BRAID_TRANSPORT=ib", "BRAID_RANK=-1", "BRAID_WORLD_SIZE=0x10",
    "BRAID_SECRET=xyz", "BRAID_UNKNOWN=1"]))
write("env", "algo_names", "BRAID_ALGO=allreduce=dbtree,alltoall=bruck,gather=nope\n")
write("env", "hostid_long", "BRAID_HOSTID=" + "h" * 257 + "\nBRAID_SHM_CMA_BYTES=auto\n")
