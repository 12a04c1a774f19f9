"""The algorithms the labs measure: decode (the one decode loop), sampling (one SamplingParams),
llama (the one Llama layer forward, shared by the engine and tensor parallelism), speculative
decoding, quantization, tensor parallelism."""
