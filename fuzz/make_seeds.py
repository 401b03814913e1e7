#!/usr/bin/env python3
"""fuzz/make_seeds.py - writes the seed inputs of fuzz/corpus/<name>/.

Each seed is a small, well-formed input of its harness (see the input
format in the header comment of fuzz/fuzz_<name>.c), so that the fuzzer
starts from messages the parser accepts and mutates from there. Seeds are
named seed-*; inputs that once crashed a harness are kept beside them as
crash-<what> (regression inputs) and are never rewritten here.

Run it from anywhere: python3 fuzz/make_seeds.py [name...] (default: all
harnesses it knows). It only (re)writes seed-* files.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# --- tcp_wire.h -------------------------------------------------------------
TCP_FRAME_MAGIC = 0x31595246
F_PUT, F_RTS, F_CTS, F_DATA, F_RESULT, F_PING, F_PONG = 1, 2, 3, 4, 5, 6, 7
FL_REPLACE, FL_CHUNK, FL_END, FL_ABORT, FL_CREDIT, FL_WANT = 1, 2, 4, 8, 16, 32


def frame(ftype, flags=0, key=b"", data=b"", cookie=0, arg=None, length=None, resv=0):
    """A data frame: header, then key and data (len = key + data unless given)."""
    if arg is None:
        arg = len(data)
    if length is None:
        length = len(key) + len(data)
    hdr = struct.pack("<IBBHIIQQ", TCP_FRAME_MAGIC, ftype, flags, len(key), length, resv,
                      cookie, arg)
    return hdr + key + data


def tcp_frames():
    s = {}
    s["eager-put"] = b"\x00" + frame(F_PUT, key=b"k1", data=b"0123456789", cookie=11)
    s["put-replace"] = b"\x00" + frame(F_PUT, key=b"k1", data=b"a", cookie=1) + \
        frame(F_PUT, FL_REPLACE, key=b"k1", data=b"bb", cookie=2)
    # An offer, then its data in two chunks (cookie 0: the slot the engine's CTS granted).
    s["offer-data"] = b"\x00" + frame(F_RTS, key=b"big", cookie=5, arg=1000, length=3) + \
        frame(F_DATA, data=b"x" * 600, cookie=0, arg=0) + \
        frame(F_DATA, data=b"y" * 400, cookie=0, arg=600)
    # The data longer than what the input holds: received straight into the block, then EOF.
    s["offer-short"] = b"\x00" + frame(F_RTS, key=b"big", cookie=5, arg=70000, length=3) + \
        frame(F_DATA, data=b"z" * 100, cookie=0, arg=0, length=70000)
    # Answers to the engine's eager PUT (bit 0) and its offer (bit 1).
    s["result-eager"] = b"\x01" + frame(F_RESULT, cookie=0, arg=0)
    s["result-refused"] = b"\x01" + frame(F_RESULT, cookie=0, arg=(-17) & (2**64 - 1))
    s["cts-result"] = b"\x02" + frame(F_CTS, cookie=0, arg=7) + frame(F_RESULT, cookie=0, arg=0)
    s["both"] = b"\x03" + frame(F_RESULT, cookie=0, arg=0) + frame(F_CTS, cookie=1, arg=9) + \
        frame(F_RESULT, cookie=1, arg=0)
    s["ping-pong"] = b"\x00" + frame(F_PING, cookie=3) + frame(F_PONG, cookie=4)
    s["stream"] = b"\x00" + frame(F_PUT, FL_CHUNK, key=b"req1_s_0", data=b"c0", cookie=1) + \
        frame(F_PUT, FL_CHUNK | FL_END, key=b"req1_s_1", data=b"c1", cookie=2)
    s["stream-abort"] = b"\x00" + frame(F_PUT, FL_CHUNK | FL_ABORT, key=b"req2_s_0",
                                        data=b"because", cookie=1)
    s["credit"] = b"\x00" + frame(F_PUT, FL_CREDIT, key=b"req3_s", data=struct.pack("<Q", 4),
                                  cookie=1) + frame(F_PUT, FL_WANT, key=b"req3_s", cookie=2)
    # Everything in one send (bit 2).
    s["one-send"] = b"\x04" + frame(F_PUT, key=b"a", data=b"1", cookie=1) + \
        frame(F_PING, cookie=2) + frame(F_RTS, key=b"b", cookie=3, arg=10, length=1)
    s["bad-magic"] = b"\x00" + b"\x00" * 32
    return s


# --- tcp_wire.h: struct tcp_hello (224 bytes) -------------------------------
TCP_HELLO_MAGIC = 0x4f4c4c4548595246
H_HELLO, H_PROOF, H_AUTH, H_OK, H_NO = 1, 2, 3, 4, 5


def hello(htype, name=b"fz", ns=b"fz", caps=3, status=0, index=0, nconns=1, link=1,
          nonce=b"N" * 32, mac=b"", version=1, magic=TCP_HELLO_MAGIC):
    """A hello message; an all-zero mac is filled in right by the harness."""
    return struct.pack("<QHHIIHHQ32s32s64s64s", magic, version, htype, caps, status, index,
                       nconns, link, nonce, mac, ns, name)


def tcp_handshake():
    s = {}
    put = frame(F_PUT, key=b"hk", data=b"hello", cookie=1)
    s["call-ok"] = b"\x00" + hello(H_HELLO) + hello(H_AUTH) + put
    s["call-two-conns"] = b"\x00" + hello(H_HELLO, index=1, nconns=2, link=7) + hello(H_AUTH)
    s["call-wrong-mac"] = b"\x00" + hello(H_HELLO) + hello(H_AUTH, mac=b"\x01" * 32)
    s["call-wrong-ns"] = b"\x00" + hello(H_HELLO, ns=b"other")
    s["call-version"] = b"\x00" + hello(H_HELLO, version=2)
    s["call-index"] = b"\x00" + hello(H_HELLO, index=3, nconns=2)
    s["call-short"] = b"\x00" + hello(H_HELLO)[:100]
    s["called-ok"] = b"\x01" + hello(H_PROOF, name=b"up") + hello(H_OK, name=b"up") + \
        frame(F_PING, cookie=1)
    s["called-no"] = b"\x01" + hello(H_NO, name=b"up", status=13)
    s["called-no-after-auth"] = b"\x01" + hello(H_PROOF, name=b"up") + \
        hello(H_NO, name=b"up", status=1)
    s["called-wrong-name"] = b"\x01" + hello(H_PROOF, name=b"imposter")
    s["called-wrong-mac"] = b"\x01" + hello(H_PROOF, name=b"up", mac=b"\x02" * 32)
    return s


# --- ctl_wire.h ---------------------------------------------------------------
CTL_MAGIC = 0x4c544346
(C_HELLO, C_PROOF, C_AUTH, C_OK, C_NO, C_PING, C_PONG, C_HEALTH_REQ, C_HEALTH, C_LOOKUP,
 C_LOOKUP_ANS, C_FETCH, C_FETCH_ANS, C_CANCEL, C_CANCEL_ANS, C_BYE, C_FORGET) = range(1, 18)


def ctl(ctype, body=b"", seq=0, version=1, resv=0):
    return struct.pack("<IHHIIQ", CTL_MAGIC, version, ctype, len(body), resv, seq) + body


def ctl_hello(caller=b"fzA", callee=b"fzc", ns=b"fz", caps=15):
    return ctl(C_HELLO, struct.pack("<II64s64s64s32s", caps, 0, ns, caller, callee, b"n" * 32))


def ctl_key(key, flags=0, timeout_ms=0):
    return struct.pack("<IIHHI", flags, timeout_ms, len(key), 0, 0) + key


def ctl_answer(res, length=0):
    return struct.pack("<iIQ", res, 0, length)


def rec_msg(m, frm=0):
    """A message record of fuzz_ctl: from routing id frm (0 A, 1 B), with a peer address."""
    return bytes([(frm << 2)]) + struct.pack("<H", len(m)) + m


def rec_ask(what):
    return bytes([3 | (what << 2)])


def fuzz_ctl():
    s = {}
    auth = ctl(C_AUTH, struct.pack("<32s128s", b"", b"tcp://127.0.0.1:9"))
    s["callee-handshake"] = b"\x00" + rec_msg(ctl_hello()) + rec_msg(auth) + \
        rec_msg(ctl(C_PING, seq=5))
    s["callee-wrong-callee"] = b"\x00" + rec_msg(ctl_hello(callee=b"other"))
    s["callee-bad-name"] = b"\x00" + rec_msg(ctl_hello(caller=b"a b"))
    s["callee-wrong-mac"] = b"\x00" + rec_msg(ctl_hello()) + \
        rec_msg(ctl(C_AUTH, struct.pack("<32s128s", b"\x01" * 32, b"")))
    s["callee-two-ids"] = b"\x00" + rec_msg(ctl_hello()) + rec_msg(ctl_hello(caller=b"fzB"), 1) + \
        rec_msg(auth, 1) + rec_msg(auth)
    s["ready-requests"] = b"\x02" + rec_msg(ctl(C_HEALTH_REQ, seq=1)) + \
        rec_msg(ctl(C_LOOKUP, ctl_key(b"k1"), seq=2)) + \
        rec_msg(ctl(C_FETCH, ctl_key(b"k1", timeout_ms=50), seq=3)) + \
        rec_msg(ctl(C_FETCH, ctl_key(b"k2", flags=1), seq=4)) + \
        rec_msg(ctl(C_FORGET, ctl_key(b"k1"), seq=3)) + \
        rec_msg(ctl(C_CANCEL, ctl_key(b"req1"), seq=5)) + rec_msg(ctl(C_BYE))
    s["ready-answers"] = b"\x02" + rec_ask(0) + rec_ask(1) + rec_ask(3) + rec_ask(4) + \
        rec_msg(ctl(C_HEALTH, ctl_answer(2, 2) + b"{}", seq=0)) + \
        rec_msg(ctl(C_LOOKUP_ANS, ctl_answer(1, 10), seq=0)) + \
        rec_msg(ctl(C_CANCEL_ANS, ctl_answer(0), seq=0)) + \
        rec_msg(ctl(C_FETCH_ANS, ctl_answer(1), seq=0))
    s["ready-lookup-all"] = b"\x02" + rec_ask(2) + rec_msg(ctl(C_LOOKUP_ANS, ctl_answer(2, 5), seq=0))
    proof = ctl(C_PROOF, struct.pack("<II64s32s32s", 15, 0, b"fzC", b"p" * 32, b""))
    s["caller-handshake"] = b"\x01" + rec_msg(proof) + \
        rec_msg(ctl(C_OK, struct.pack("<128s", b"tcp://0.0.0.0:9"))) + rec_msg(ctl(C_PING, seq=9))
    s["caller-no"] = b"\x01" + rec_msg(ctl(C_NO, ctl_answer(-13)))
    s["caller-answers"] = b"\x03" + rec_ask(0) + rec_ask(5) + \
        rec_msg(ctl(C_HEALTH, ctl_answer(-5), seq=0)) + \
        rec_msg(ctl(C_FETCH_ANS, ctl_answer(-11), seq=0))
    s["bad-header"] = b"\x00" + rec_msg(ctl(C_PING, version=2)) + rec_msg(ctl(C_PING, resv=1)) + \
        rec_msg(b"\x00" * 10)
    return s


# --- shm_wire.h ---------------------------------------------------------------
D_PUT, C_RESULT, C_RELEASE, C_RESULT_FREE, D_PUT_INLINE, C_RESULT_INLINE = 1, 2, 3, 4, 5, 6
W_CHUNK, W_END = 1 << 16, 1 << 17


def put_entry(etype, key, data=b"", op_cookie=7, buf_cookie=0, offset=0, length=None, flags=0):
    """A PUT record of fuzz_shm_ring: entry fields after seq, body length, body."""
    if length is None:
        length = len(data)
    body = key + b"\x00"
    if etype == D_PUT_INLINE:
        body = body.ljust((len(key) + 1 + 7) & ~7, b"\x00") + data
    return b"\x00" + struct.pack("<HHIIQQQQ", etype, len(key), flags, 0, op_cookie, buf_cookie,
                                 offset, length) + bytes([len(body)]) + body


def ctrl_entry(ctype, res=0, which=0, fixup=True, op_cookie=0, offset=0):
    """A control record; with fixup the cookies are those of the engine's PUT `which`."""
    return bytes([1 | (8 if fixup else 0)]) + struct.pack("<HHiIQQQ", ctype, 0, res, 0, op_cookie,
                                                          which, offset)


def shm_ring():
    s = {}
    s["put-inline"] = b"\x00" + put_entry(D_PUT_INLINE, b"k1", b"0123456789")
    s["put-block"] = b"\x00" + put_entry(D_PUT, b"k3", offset=4096, length=1000, buf_cookie=3)
    s["put-into-get"] = b"\x10" + put_entry(D_PUT_INLINE, b"k1", b"abc") + \
        put_entry(D_PUT, b"k1", offset=0, length=300, buf_cookie=1)
    s["put-block-to-get"] = b"\x10" + put_entry(D_PUT, b"k1", offset=8192, length=512, buf_cookie=2)
    s["put-block-to-get-nofree"] = b"\x18" + put_entry(D_PUT, b"k1", offset=0, length=64)
    s["put-zero-copy"] = b"\x20" + put_entry(D_PUT, b"k2", offset=0, length=4096, buf_cookie=5)
    s["results"] = b"\x03" + ctrl_entry(C_RESULT, 0, 0) + ctrl_entry(C_RELEASE, 0, 0) + \
        ctrl_entry(C_RESULT, -17, 1)
    s["result-free"] = b"\x01" + ctrl_entry(C_RESULT_FREE, 0, 0)
    s["result-inline"] = b"\x04" + ctrl_entry(C_RESULT_INLINE, 0, 0)
    s["release-twice"] = b"\x01" + ctrl_entry(C_RESULT, 0, 0) + ctrl_entry(C_RELEASE, 0, 0) + \
        ctrl_entry(C_RELEASE, 0, 0)
    s["stream-chunks"] = b"\x00" + put_entry(D_PUT_INLINE, b"r1_s_0", b"c0", flags=W_CHUNK) + \
        put_entry(D_PUT_INLINE, b"r1_s_1", b"c1", flags=W_CHUNK | W_END)
    s["bad-seq"] = b"\x00" + b"\x04" + struct.pack("<I", 77) + \
        put_entry(D_PUT_INLINE, b"k1", b"x")[1:]
    s["scribble-heads"] = b"\x01" + bytes([2]) + struct.pack("<I", 5000) + b"\x03" + \
        bytes([2 | (1 << 2)]) + struct.pack("<I", 0xffffffff) + bytes([2 | (2 << 2)]) + \
        struct.pack("<I", 1) + bytes([2 | (4 << 2)]) + struct.pack("<I", 1)
    return s


# --- shm_sock.h: struct shm_hello (200 bytes) ---------------------------------
SHM_MAGIC = 0x46525259
SHM_RINGS_BYTES = 1576960  # shm_wire.h, rounded up to pages
SHM_PUT_ENTRIES = 1024
MIB = 1 << 20
# fuzz_shm_hello fd kinds: kind % 8, size index (kind >> 3) % 6 of
# [0, 4 KiB, 64 KiB, 1 MiB, rings, 2 MiB]
FD_SEALED, FD_UNSEALED, FD_EVENT, FD_NULL, FD_PIPE, FD_SOCK, FD_POOL, FD_GROWSEAL = range(8)
SZ_4K, SZ_1M, SZ_RINGS = 1, 3, 4


def fd_kind(kind, size=0):
    return kind | (size << 3)


def shm_hello_msg(name=b"fzevil", ns=b"fz", nfds=4, pool=MIB, entries=SHM_PUT_ENTRIES,
                  ring_bytes=SHM_RINGS_BYTES, caps=2, version=2, size=200, magic=SHM_MAGIC):
    return struct.pack("<IHHII64s64sQIIQ4Q", magic, version, size, caps, nfds, ns, name, pool,
                       entries, ring_bytes, 0, 0, 0, 0, 0)


def hello_input(opt, msg, kinds):
    return bytes([opt]) + struct.pack("<H", len(msg)) + msg + bytes([len(kinds)]) + bytes(kinds)


def shm_hello():
    s = {}
    caller_fds = [fd_kind(FD_POOL, SZ_1M), fd_kind(FD_EVENT), fd_kind(FD_SEALED, SZ_4K),
                  fd_kind(FD_SEALED, SZ_RINGS)]
    answer_fds = caller_fds[:3]
    s["call-ok"] = hello_input(0, shm_hello_msg(), caller_fds)
    s["call-unsealed-pool"] = hello_input(0, shm_hello_msg(), [fd_kind(FD_UNSEALED, SZ_1M)] +
                                          caller_fds[1:])
    s["call-doorbell-not-eventfd"] = hello_input(0, shm_hello_msg(),
                                                 [caller_fds[0], fd_kind(FD_PIPE)] +
                                                 caller_fds[2:])
    s["call-pool-too-small"] = hello_input(0, shm_hello_msg(pool=2 * MIB), caller_fds)
    s["call-rings-wrong-size"] = hello_input(0, shm_hello_msg(), caller_fds[:3] +
                                             [fd_kind(FD_SEALED, SZ_1M)])
    s["call-three-fds"] = hello_input(0, shm_hello_msg(nfds=3), caller_fds[:3])
    s["call-nfds-mismatch"] = hello_input(0, shm_hello_msg(nfds=2), caller_fds)
    s["call-too-many-fds"] = hello_input(0, shm_hello_msg(nfds=6), caller_fds +
                                         [fd_kind(FD_NULL), fd_kind(FD_SOCK)])
    s["call-version"] = hello_input(0, shm_hello_msg(version=1), caller_fds)
    s["call-short"] = hello_input(0, shm_hello_msg()[:40], [])
    s["call-health"] = hello_input(0, shm_hello_msg(nfds=0, caps=1), [])
    s["call-grow-seal-only"] = hello_input(0, shm_hello_msg(), [fd_kind(FD_GROWSEAL, SZ_1M)] +
                                           caller_fds[1:])
    s["called-ok"] = hello_input(1, shm_hello_msg(name=b"fzhl", nfds=3), answer_fds)
    s["called-wrong-name"] = hello_input(1, shm_hello_msg(name=b"other", nfds=3), answer_fds)
    s["called-four-fds"] = hello_input(1, shm_hello_msg(name=b"fzhl"), caller_fds)
    s["called-no-fds"] = hello_input(1, shm_hello_msg(name=b"fzhl", nfds=0), [])
    s["called-wake-too-small"] = hello_input(1, shm_hello_msg(name=b"fzhl", nfds=3),
                                             answer_fds[:2] + [fd_kind(FD_SEALED, 0)])
    return s


HARNESSES = {
    "ctl": fuzz_ctl,
    "shm_hello": shm_hello,
    "shm_ring": shm_ring,
    "tcp_frames": tcp_frames,
    "tcp_handshake": tcp_handshake,
}


def main(names):
    for name in names or sorted(HARNESSES):
        seeds = HARNESSES[name]()
        d = os.path.join(HERE, "corpus", name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.unlink(os.path.join(d, f))
        for k, v in sorted(seeds.items()):
            with open(os.path.join(d, "seed-" + k), "wb") as out:
                out.write(v)
        print(f"{name}: {len(seeds)} seeds in {os.path.relpath(d)}")


if __name__ == "__main__":
    main(sys.argv[1:])
