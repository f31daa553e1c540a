"""The systems the benchmark compares, each serving the same requests in the same process.

Every peer returns a `bench.stats.PeerRun`: one trace per request and the tokens it fed the
model. Static peers (the lecture's loops, HF `generate`) take all requests at once; the
continuous ones (`generate_batch`'s manager, Tandem's engine) also take arrival times.
"""
