"""Text towers and tokenizers of the two-tower models: the CLIP BPE tokenizer
(`clip_tokenizer`), the SentencePiece / HF tokenizers (`tokenizers`) and the text transformer
(`transformer`) that SigLIP and CLIP share.
"""
