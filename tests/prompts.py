"""Prompts for the speculative identity tests: code, prose, chat and multilingual."""

PROMPTS: list[tuple[str, str, bool]] = [  # (category, text, wrap as chat)
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("code", "#include <stdio.h>\n\nint main(void) {\n    int a[] = {5, 3, 9, 1};\n", False),
    ("code", "class LRUCache:\n    def __init__(self, capacity: int):\n", False),
    ("code", "fn main() {\n    let v: Vec<i32> = (1..10).collect();\n", False),
    ("code", "SELECT name, COUNT(*) AS n\nFROM orders\n", False),
    ("code", "Write a Python function that checks whether a string is a palindrome.", True),
    ("code", "Implement quicksort and mergesort in C.", True),
    ("code", "function debounce(fn, ms) {\n", False),
    ("prose", "The lighthouse keeper had not seen a ship in eleven years, until", False),
    ("prose", "Hash tables are a fundamental data structure because", False),
    ("prose", "Once upon a time, in a small village by the sea,", False),
    ("prose", "The history of the printing press begins", False),
    ("prose", "In economics, inflation is", False),
    ("chat", "What is the capital of Australia, and why is it not Sydney?", True),
    ("chat", "Give me three tips for learning to play the guitar.", True),
    ("chat", "Explain recursion to a five-year-old.", True),
    ("chat", "Summarize the plot of Hamlet in two sentences.", True),
    ("multilingual", "Écris un court poème sur la mer.", True),
    ("multilingual", "日本の首都はどこですか？その歴史を説明してください。", True),
    ("multilingual", "Der schnelle braune Fuchs springt über den faulen Hund, und dann", False),
]
