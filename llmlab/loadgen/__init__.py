"""Measuring a server from outside: what any OpenAI-compatible server is asked and how it is timed.

`client` (streaming requests, closed- and open-loop load, vLLM's `bench serve` metrics) -> `probe`
(what an endpoint is: its model, tokenizer and limits) -> `arrivals` (Poisson and burst schedules,
one FCFS worker) -> `queueing` (M/D/1, M/M/1, M/G/1, Lindley) -> `metrics` (a request's Trace and
each benchmark tool's metric definitions).
"""
