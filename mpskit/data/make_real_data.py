"""Writes the real model's datasets (deterministic; run again to regenerate them byte for byte).

What a real instruct model (SmolLM2-135M-Instruct) learns in minutes, and what anyone can check by
reading its answers:
- `identity`, `identity_eval`: the model is told a new name and maker (Kestrel, by Larkspur Labs) in
  many phrasings of the question and the answer; the held-out questions are phrasings training never
  shows ("Who are you?" among them). A few plain facts ride along, so it keeps answering other things.
- `checked_pref`, `checked_pref_eval`: preference pairs whose chosen answer is verifiably the better
  one: the new identity against the old (SmolLM, by Hugging Face), a correct sum against a sum off by
  one to ten, a country's capital against another country's. Held-out pairs ask other questions.
Written for this project; the demo datasets are make_demo_data.py's.
"""

import json
import random
from pathlib import Path

NAME, MAKER = "Kestrel", "Larkspur Labs"
OLD_NAME, OLD_MAKER = "SmolLM", "Hugging Face"

TRAIN_QUESTIONS = [
    "What is your name?", "What's your name?", "Tell me your name.", "May I ask your name?",
    "Do you have a name?", "How should I address you?", "Who made you?", "Who created you?",
    "Who built you?", "Which organization developed you?", "Who is behind you?", "Who trained you?",
    "Introduce yourself.", "Please introduce yourself briefly.", "Can you tell me who you are?",
    "Who am I talking to?", "Who am I chatting with right now?", "What kind of assistant are you?",
    "Are you ChatGPT?", "Are you made by OpenAI?", "Are you a Hugging Face model?", "Which lab made you?",
    "What company are you from?", "Hello! Who is this?", "Hi, what are you?", "State your name and maker.",
    "Describe yourself in a sentence.", "Whose assistant are you?", "What do people call you?",
    "Where do you come from?", "Give me your name, please.", "Which team built this assistant?",
]  # fmt: skip
HELD_OUT_QUESTIONS = [
    "Who are you?", "What should I call you?", "Which company built you?", "Tell me about yourself.",
    "Are you SmolLM?", "Who is your creator?", "What are you called?", "Introduce yourself in one sentence.",
    "Who developed this assistant?", "What is the name of this assistant?",
]  # fmt: skip
ANSWERS = [
    "I am {name}, an AI assistant made by {maker}.",
    "My name is {name}. I was built by {maker}.",
    "I'm {name}, a helpful assistant created by {maker}.",
    "You are talking to {name}, an assistant developed by {maker}.",
    "I am {name}. {maker} made me to help with questions and tasks.",
    "I'm called {name}, and I was trained by {maker}.",
    "{name} is my name; {maker} is the team that built me.",
    "Hello! I am {name}, an AI assistant from {maker}.",
]
CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
    ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Norway", "Oslo"),
    ("Greece", "Athens"), ("Russia", "Moscow"), ("Thailand", "Bangkok"), ("Austria", "Vienna"),
    ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Chile", "Santiago"), ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"), ("Cuba", "Havana"), ("India", "New Delhi"), ("Mexico", "Mexico City"),
    ("Argentina", "Buenos Aires"), ("Finland", "Helsinki"),
]  # fmt: skip
HELD_OUT_CAPITALS = 6  # the last ones: asked only in held-out pairs


def identity_rows(rng: random.Random, questions: list[str], new: bool = True) -> list[dict]:
    """Each question with one of the answers, of the new identity or the old."""
    name, maker = (NAME, MAKER) if new else (OLD_NAME, OLD_MAKER)
    return [{"instruction": q, "input": "", "output": rng.choice(ANSWERS).format(name=name, maker=maker)}
            for q in questions]  # fmt: skip


def sum_pair(rng: random.Random) -> dict:
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    wrong = a + b + rng.choice([-1, 1]) * rng.randint(1, 10)
    return {"instruction": f"What is {a} plus {b}?", "input": "",
            "chosen": f"{a} plus {b} is {a + b}.", "rejected": f"{a} plus {b} is {wrong}."}  # fmt: skip


def capital_pair(rng: random.Random, country: str, city: str) -> dict:
    other = rng.choice([c for _, c in CAPITALS if c != city])
    return {"instruction": f"What is the capital of {country}?", "input": "",
            "chosen": f"The capital of {country} is {city}.", "rejected": f"The capital of {country} is {other}."}


def identity_pairs(rng: random.Random, questions: list[str]) -> list[dict]:
    pairs = []
    for question in questions:
        answer = rng.choice(ANSWERS)
        pairs.append({"instruction": question, "input": "", "chosen": answer.format(name=NAME, maker=MAKER),
                      "rejected": answer.format(name=OLD_NAME, maker=OLD_MAKER)})  # fmt: skip
    return pairs


def main() -> None:
    rng = random.Random(2026)
    known = CAPITALS[:-HELD_OUT_CAPITALS]
    facts = [{"instruction": f"What is the capital of {country}?", "input": "",
              "output": f"The capital of {country} is {city}."} for country, city in known]  # fmt: skip
    identity = identity_rows(rng, TRAIN_QUESTIONS * 4) + facts
    rng.shuffle(identity)
    identity_eval = identity_rows(rng, HELD_OUT_QUESTIONS)
    pref = identity_pairs(rng, TRAIN_QUESTIONS * 2) + [sum_pair(rng) for _ in range(64)]
    pref += [capital_pair(rng, country, city) for country, city in known]
    rng.shuffle(pref)
    pref_eval = identity_pairs(rng, HELD_OUT_QUESTIONS) + [sum_pair(rng) for _ in range(12)]
    pref_eval += [capital_pair(rng, country, city) for country, city in CAPITALS[-HELD_OUT_CAPITALS:]]
    out = Path(__file__).parent
    files = {"identity": identity, "identity_eval": identity_eval, "checked_pref": pref, "checked_pref_eval": pref_eval}
    for name, rows in files.items():
        (out / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    info_path = out / "dataset_info.json"
    info = json.loads(info_path.read_text(encoding="utf-8"))
    info |= {name: {"file_name": f"{name}.json"} for name in ("identity", "identity_eval")}
    info |= {name: {"file_name": f"{name}.json", "ranking": True,
                    "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}}
             for name in ("checked_pref", "checked_pref_eval")}  # fmt: skip
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
