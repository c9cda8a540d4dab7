"""Formats room: every storage format of a KV cache and its exact bytes.

registry.py holds FORMATS and get_format (and the dense float formats), quant.py the quantized
ones, protocol.py the Format protocol they implement. Formats import no store, attention or model.
"""
