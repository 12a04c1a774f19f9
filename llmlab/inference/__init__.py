"""The algorithms the labs measure: sampling, decoding, speculative decoding."""
