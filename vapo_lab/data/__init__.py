"""Benchmark data shipped with the package: AIME 2024/2025, MATH-500, GSM8K test (see README.md).

Read through ``vapo_lab.eval.load_benchmark``; this folder holds data files only.
"""
