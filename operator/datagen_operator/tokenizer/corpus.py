"""Deterministic synthetic text: the stand-in tokenizer's training text and the simulator's output text.

Nothing here reads the network or the Python installation: the same words, the same seed and the same
`random.Random` algorithm give the same text on every machine, so the tokenizer built from it is
reproducible byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

# Common English words, roughly by frequency class; enough variety for a few thousand BPE merges.
ENGLISH_WORDS: tuple[str, ...] = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "that",
        "it",
        "for",
        "on",
        "with",
        "as",
        "was",
        "be",
        "by",
        "this",
        "are",
        "or",
        "at",
        "from",
        "have",
        "an",
        "not",
        "which",
        "but",
        "they",
        "you",
        "we",
        "all",
        "can",
        "there",
        "one",
        "has",
        "were",
        "will",
        "more",
        "their",
        "if",
        "about",
        "would",
        "so",
        "what",
        "when",
        "been",
        "up",
        "out",
        "into",
        "some",
        "time",
        "them",
        "other",
        "than",
        "then",
        "these",
        "its",
        "two",
        "may",
        "only",
        "first",
        "new",
        "also",
        "any",
        "like",
        "could",
        "most",
        "over",
        "very",
        "after",
        "many",
        "such",
        "where",
        "through",
        "back",
        "years",
        "much",
        "before",
        "good",
        "just",
        "used",
        "because",
        "each",
        "people",
        "those",
        "well",
        "should",
        "make",
        "same",
        "work",
        "while",
        "both",
        "between",
        "under",
        "never",
        "last",
        "long",
        "great",
        "little",
        "state",
        "world",
        "own",
        "here",
        "three",
        "still",
        "might",
        "high",
        "every",
        "number",
        "part",
        "place",
        "case",
        "week",
        "company",
        "system",
        "program",
        "question",
        "government",
        "point",
        "group",
        "problem",
        "fact",
        "hand",
        "right",
        "small",
        "large",
        "next",
        "early",
        "young",
        "important",
        "few",
        "public",
        "bad",
        "able",
        "order",
        "model",
        "data",
        "token",
        "answer",
        "reason",
        "value",
        "result",
        "step",
        "check",
        "function",
        "server",
        "request",
        "response",
        "stream",
        "batch",
        "prompt",
        "output",
        "input",
        "think",
        "thinking",
        "assistant",
        "user",
        "message",
        "tool",
        "call",
        "section",
        "begin",
        "end",
        "start",
        "stop",
        "length",
        "count",
        "total",
        "rate",
        "error",
        "retry",
        "record",
        "shard",
        "worker",
        "volume",
        "cluster",
        "node",
        "memory",
        "parallel",
        "tensor",
        "layer",
        "weight",
        "vector",
        "matrix",
        "compute",
        "kernel",
        "cache",
        "queue",
        "latency",
        "throughput",
        "second",
        "minute",
        "hour",
        "simple",
        "clear",
        "careful",
        "exact",
        "consider",
        "suppose",
        "therefore",
        "however",
        "because",
        "since",
        "although",
        "whether",
        "given",
        "note",
        "recall",
        "compare",
        "first",
        "second",
        "third",
        "finally",
        "overall",
        "example",
        "instance",
        "method",
        "approach",
        "solution",
        "equation",
        "sum",
        "product",
        "difference",
        "ratio",
        "integer",
        "prime",
        "even",
        "odd",
        "square",
        "root",
        "factor",
        "divide",
        "multiply",
        "add",
        "subtract",
        "probability",
        "expected",
        "variance",
        "mean",
        "median",
        "sample",
        "distribution",
        "random",
        "seed",
        "chain",
        "proof",
        "lemma",
        "theorem",
        "claim",
        "assume",
        "hence",
        "thus",
        "so",
        "verify",
        "compute",
        "derive",
        "simplify",
        "estimate",
        "bound",
        "code",
        "python",
        "rust",
        "go",
        "java",
        "string",
        "list",
        "dict",
        "map",
        "set",
        "array",
        "index",
        "loop",
        "branch",
        "class",
        "object",
        "file",
        "path",
        "line",
        "column",
        "read",
        "write",
        "open",
        "close",
        "parse",
        "format",
        "encode",
        "decode",
        "byte",
        "bytes",
        "utf",
        "json",
        "table",
        "schema",
        "field",
        "key",
        "column",
        "row",
        "query",
        "join",
        "filter",
        "sort",
        "group",
        "merge",
        "split",
        "window",
    ]
)

TECH_TOKENS: tuple[str, ...] = (
    "def", "return", "import", "async", "await", "self", "None", "True", "False", "lambda", "yield",
    "x", "y", "z", "n", "i", "k", "f(x)", "g(n)", "O(n)", "O(n log n)", "==", "!=", "<=", ">=", "->",
    "=>", "::", "{}", "[]", "()", "//", "/*", "*/", "#", "@", "%", "&&", "||", "+=", "-=", "**",
    "http://localhost:30000", "/generate", "max_new_tokens", "input_ids", "output_ids", "0.5", "1e-3",
)  # fmt: skip

# Common Chinese characters, kana, Cyrillic and Greek words, emoji: so byte-level merges also learn
# whole multi-byte characters (as the real tiktoken vocabulary has).
CJK_CHARACTERS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后"
    "小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
    "知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最"
    "模型数据推理答案问题思考步骤结果检查工具调用服务器请求响应输出输入令牌批次集群节点内存并行"
)
KANA = "".join(chr(c) for c in range(0x3041, 0x3097)) + "".join(chr(c) for c in range(0x30A1, 0x30FB))
CYRILLIC_WORDS = ("и", "в", "не", "на", "что", "модель", "данные", "ответ", "вопрос", "сервер", "токен")
GREEK_WORDS = ("και", "το", "να", "είναι", "λόγος", "απάντηση", "α", "β", "γ", "δ", "λ", "π", "σ")
EMOJI = ("🙂", "🚀", "✅", "❌", "🤔", "📈", "🔥", "💡", "⚠️", "👍", "🧠", "📦")
PUNCTUATION = (".", ",", ";", ":", "?", "!", "-", "'", '"', "(", ")")

_REASONING_OPENERS = (
    "Let me think about this.", "First, I need to understand the question.", "Hmm, wait.",
    "Let me check the previous step.", "So the key point is", "Actually, let me reconsider.",
    "Okay, so", "Now consider", "This means that", "Let me verify:", "Suppose that",
)  # fmt: skip
_ANSWER_OPENERS = (
    "The answer is", "In short,", "Here is the result:", "To summarize,", "Overall,", "Yes,", "No,",
    "The main steps are:", "Note that", "In practice,",
)  # fmt: skip


def _english_sentence(rng: random.Random, openers: tuple[str, ...]) -> str:
    words = [rng.choice(ENGLISH_WORDS) for _ in range(rng.randint(5, 18))]
    if rng.random() < 0.25:
        words.insert(rng.randrange(len(words)), rng.choice(TECH_TOKENS))
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 10_000)))
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), rng.choice(PUNCTUATION) + rng.choice(ENGLISH_WORDS))
    opener = rng.choice(openers) + " " if rng.random() < 0.35 else ""
    sentence = opener + " ".join(words)
    return sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "?", "!", ":"))


def _cjk_sentence(rng: random.Random) -> str:
    chars = [rng.choice(CJK_CHARACTERS) for _ in range(rng.randint(6, 24))]
    if rng.random() < 0.3:
        chars.insert(rng.randrange(len(chars)), rng.choice(KANA) * rng.randint(1, 2))
    return "".join(chars) + rng.choice(("。", "，", "？", "！"))


def _other_sentence(rng: random.Random) -> str:
    pool = CYRILLIC_WORDS if rng.random() < 0.5 else GREEK_WORDS
    words = [rng.choice(pool) for _ in range(rng.randint(3, 10))]
    if rng.random() < 0.5:
        words.append(rng.choice(EMOJI))
    return " ".join(words) + "."


def training_lines(seed: int = 20261129, count: int = 40_000) -> Iterator[str]:
    """Mixed-script lines for training the stand-in's BPE merges (mostly English, like real data)."""
    rng = random.Random(seed)
    for _ in range(count):
        roll = rng.random()
        if roll < 0.72:
            yield _english_sentence(rng, _REASONING_OPENERS + _ANSWER_OPENERS)
        elif roll < 0.9:
            yield _cjk_sentence(rng)
        else:
            yield _other_sentence(rng)


def reasoning_sentences(seed: int, count: int) -> list[str]:
    """English 'thinking' sentences, each starting with a space so they concatenate cleanly."""
    rng = random.Random(seed)
    return [" " + _english_sentence(rng, _REASONING_OPENERS) for _ in range(count)]


def answer_sentences(seed: int, count: int) -> list[str]:
    """English answer sentences with an occasional emoji, each starting with a space."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        sentence = _english_sentence(rng, _ANSWER_OPENERS)
        if rng.random() < 0.05:
            sentence += " " + rng.choice(EMOJI)
        out.append(" " + sentence)
    return out
