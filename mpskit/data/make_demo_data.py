"""Writes the demo datasets (deterministic; run again to regenerate them byte for byte).

Chinese and English prompts about arithmetic, capitals, opposites and colours. The preference data
prefers a complete, correct answer over an evasive one: a consistent pattern that even the tiny demo
model learns in a couple of epochs, so DPO's held-out reward accuracy has somewhere to go.
"""

import json
import random
from pathlib import Path

CAPITALS = [
    ("France", "Paris", "法国", "巴黎"),
    ("Japan", "Tokyo", "日本", "东京"),
    ("Italy", "Rome", "意大利", "罗马"),
    ("Germany", "Berlin", "德国", "柏林"),
    ("Spain", "Madrid", "西班牙", "马德里"),
    ("China", "Beijing", "中国", "北京"),
    ("Egypt", "Cairo", "埃及", "开罗"),
    ("Canada", "Ottawa", "加拿大", "渥太华"),
    ("Kenya", "Nairobi", "肯尼亚", "内罗毕"),
    ("Peru", "Lima", "秘鲁", "利马"),
    ("Norway", "Oslo", "挪威", "奥斯陆"),
    ("Greece", "Athens", "希腊", "雅典"),
    ("Russia", "Moscow", "俄罗斯", "莫斯科"),
    ("Thailand", "Bangkok", "泰国", "曼谷"),
    ("Austria", "Vienna", "奥地利", "维也纳"),
    ("Portugal", "Lisbon", "葡萄牙", "里斯本"),
    ("Ireland", "Dublin", "爱尔兰", "都柏林"),
    ("Chile", "Santiago", "智利", "圣地亚哥"),
]
OPPOSITES = [
    ("hot", "cold", "热", "冷"),
    ("big", "small", "大", "小"),
    ("fast", "slow", "快", "慢"),
    ("up", "down", "上", "下"),
    ("old", "new", "旧", "新"),
    ("light", "dark", "明", "暗"),
    ("long", "short", "长", "短"),
    ("high", "low", "高", "低"),
    ("early", "late", "早", "晚"),
    ("open", "closed", "开", "关"),
    ("full", "empty", "满", "空"),
    ("rich", "poor", "富", "穷"),
]
COLOURS = [
    ("the sky on a clear day", "blue", "晴天的天空", "蓝色"),
    ("grass", "green", "草", "绿色"),
    ("snow", "white", "雪", "白色"),
    ("a ripe banana", "yellow", "熟香蕉", "黄色"),
    ("coal", "black", "煤", "黑色"),
    ("a ripe tomato", "red", "熟西红柿", "红色"),
    ("an orange", "orange", "橙子", "橙色"),
    ("a plum", "purple", "李子", "紫色"),
]
EVASIVE_EN = ["I am not sure.", "Hard to say.", "Maybe, maybe not.", "I cannot tell.", "Ask someone else."]
EVASIVE_ZH = ["我不确定。", "很难说。", "也许吧。", "我说不上来。", "你问别人吧。"]


def qa_pairs(rng: random.Random) -> list[tuple[str, str, str]]:
    """(prompt, good answer, language) for every fact, in a fixed order."""
    pairs = []
    for _ in range(120):
        a, b = rng.randint(1, 60), rng.randint(1, 40)
        pairs.append((f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", "en"))
        pairs.append((f"{a}加{b}等于多少？", f"{a}加{b}等于{a + b}。", "zh"))
    for country, city, guo, du in CAPITALS:
        pairs.append((f"What is the capital of {country}?", f"The capital of {country} is {city}.", "en"))
        pairs.append((f"{guo}的首都是哪里？", f"{guo}的首都是{du}。", "zh"))
    for word, opposite, zi, fan in OPPOSITES:
        pairs.append((f"What is the opposite of '{word}'?", f"The opposite of '{word}' is '{opposite}'.", "en"))
        pairs.append((f"“{zi}”的反义词是什么？", f"“{zi}”的反义词是“{fan}”。", "zh"))
    for thing, colour, wu, se in COLOURS:
        pairs.append((f"What colour is {thing}?", f"{thing[0].upper() + thing[1:]} is {colour}.", "en"))
        pairs.append((f"{wu}是什么颜色的？", f"{wu}是{se}的。", "zh"))
    return pairs


def main() -> None:
    rng = random.Random(1234)
    pairs = qa_pairs(rng)
    rng.shuffle(pairs)
    held_out = len(pairs) // 6
    splits = {"eval": pairs[:held_out], "train": pairs[held_out:]}
    out = Path(__file__).parent
    for split, rows in splits.items():
        sft = [{"instruction": p, "input": "", "output": a} for p, a, _ in rows]
        pref = [
            {
                "instruction": p,
                "input": "",
                "chosen": a,
                "rejected": rng.choice(EVASIVE_EN if lang == "en" else EVASIVE_ZH),
            }
            for p, a, lang in rows
        ]
        suffix = "" if split == "train" else "_eval"
        files = [(f"demo_sft{suffix}", sft), (f"demo_pref{suffix}", pref)]
        if split == "train":  # KTO: each pair as two single answers, desirable or not
            kto = [{"instruction": row["instruction"], "input": "", "output": row[key], "kto_tag": key == "chosen"}
                   for row in pref for key in ("chosen", "rejected")]  # fmt: skip
            files.append(("demo_kto", kto))
        for name, data in files:
            (out / f"{name}.json").write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    _register(out / "dataset_info.json")


def _register(info_path: Path) -> None:
    """The demo datasets' entries in dataset_info.json, beside make_real_data.py's."""
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    info |= {name: {"file_name": f"{name}.json"} for name in ("demo_sft", "demo_sft_eval")} | {
        name: {
            "file_name": f"{name}.json",
            "ranking": True,
            "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"},
        }
        for name in ("demo_pref", "demo_pref_eval")
    }
    info["demo_kto"] = {
        "file_name": "demo_kto.json",
        "columns": {"prompt": "instruction", "query": "input", "response": "output", "kto_tag": "kto_tag"},
    }
    info_path.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
