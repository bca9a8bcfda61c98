"""Linear layers with int8 activations (llama.cpp's way of multiplying its Q4_0 and Q8_0 weights): the input
quantized to int8 per block of 32, exact integer dot products, for packed 4-bit and MXINT8 weights."""
