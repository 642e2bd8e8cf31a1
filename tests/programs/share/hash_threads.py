# bunkai share test: Python threads hashing and compressing after the main
# thread imported hashlib and zlib (libcrypto and libz loaded with dlopen
# before any thread starts). Usage: python3 hash_threads.py THREADS
# Prints one line per thread, in thread order: the transcript is the
# native one.
import hashlib
import sys
import threading
import zlib

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
out = [None] * n


def work(t):
    data = bytes((i * 7 + t) % 251 for i in range(300_000 + 1000 * t))
    h = hashlib.sha256(data).hexdigest()
    b = hashlib.blake2b(data, digest_size=16).hexdigest()
    z = zlib.compress(data, 6)
    out[t] = f"thread {t}: sha256 {h} blake2b {b} zlib {len(z)} crc {zlib.crc32(z):08x}"


threads = [threading.Thread(target=work, args=(t,)) for t in range(n)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print("\n".join(out))
