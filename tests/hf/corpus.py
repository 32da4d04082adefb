"""corpus.py — the mixed text corpus the tokenizer checks encode (and train
on): code, CJK, emoji with modifiers and ZWJ sequences, accents and
combining marks, whitespace runs of every kind, digits, URLs, special-token
spellings glued to text, and seeded random strings over a mixed alphabet.
Deterministic: the same seed gives the same corpus."""
import random

FIXED = [
    "Hello world!", " leading space", "trailing space ", "  two leading", "x",
    "I'm sure they've said we'll go, and you'd've known it's HERS'S",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i] * b[i];\n}\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "https://example.com/path?q=1&r=two#frag  mailto:someone@example.org",
    "数学是研究数量、结构以及空间等概念的一门学科。", "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장도 있습니다.", "Ünïcödé àccents: café, naïve, résumé, Zürich, São Paulo, Łódź",
    "e\u0301 vs \u00e9 and A\u030a vs \u00c5", "Z\u0335\u0321a\u0336\u0327l\u0334g\u0338o\u0337",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷🇯🇵", "Ελληνικά και Русский текст, עברית, العربية, हिन्दी, ไทย",
    "numbers 1234567890 3.14159 -42 1e10 0x1F 12,345.67 ١٢٣ ४५६",
    "tabs\tand\t\ttabs", "new\nlines\n\n\nmany", "mixed \t \n \r\n whitespace   runs     here",
    "        eight spaces", "\n\n\n", "   ", "\t", "trailing newline\n", "a  b   c    d     e",
    "<|endoftext|>Hello<|endoftext|>", "<s>[INST] hi [/INST] there</s>",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhey<|eot_id|>",
    "text<|im_end|>glued<|endoftext|> spaced <s> </s>", "caf\u00e9\u00e9\u00e9 ﬁ ligature ①②③ ™",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # list comprehension",
    "    if (a && b || !c) { return a->b[c]; }", "$ ls -la /usr/bin | grep -E '^d' > out.txt 2>&1",
    "ALL CAPS SHOUTING AND MiXeD CaSe", "don't DON'T Don'T", "...!!!???;;;:::",
    "\u00a0non-breaking\u00a0space\u2003em\u2009thin", "zero\u200bwidth\u200cjoiners\u200d",
]

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there their one all we can has been if more when will "
         "would who so no model token train data loss learning rate batch step gradient layer "
         "函数 数据 训练 模型 学习 東京 大阪 データ 모델 학습 café über naïve Straße élève").split()

ALPHABET = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            " \t\n\r  .,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`"
            "éèêëàâäôöûüçñßøåæœ"
            "中文字数据日本語カタナひらが한국어Ωπλ∑∞≈Жзы"
            "😀👍🏽❤🎉🔥\u200d\u0301\u0308\u00a0")


def random_strings(rng, n, max_len=60):
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


def sentences(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(3, 25)
        s = " ".join(rng.choice(WORDS) for _ in range(k))
        if rng.random() < 0.3:
            s = s.capitalize() + rng.choice([".", "!", "?", ",", "\n", "  ", "\n\n"])
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 10 ** rng.randint(1, 8)))
        out.append(s)
    return out


def corpus(seed, n_random=600, n_sentences=600):
    rng = random.Random(seed)
    return FIXED + sentences(rng, n_sentences) + random_strings(rng, n_random)


def specials_glued(rng, specials, texts, n):
    """Texts with the tokenizer's special-token spellings inserted at random
    places (with and without spaces around them)."""
    out = []
    for _ in range(n):
        t = rng.choice(texts)
        cut = rng.randint(0, len(t))
        sp = rng.choice(specials)
        sep = rng.choice(["", " ", "\n"])
        out.append(t[:cut] + sep + sp + sep + t[cut:])
    return out
