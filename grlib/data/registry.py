"""The real datasets: where to get them, how to check them, which files hold the logs.

KuaiRand (Gao et al., CIKM 2022; Zenodo record 10439422, CC BY-SA 4.0) comes in three versions
with the same 19-column logs; the sequences use the two standard logs of each version (the
random-exposure log `log_random_*` is left out: its videos were inserted at random, not chosen
by the recommender or the user's history). Figures from KuaiRand's official README.
MovieLens-100K (GroupLens) is the small second dataset with known behaviour.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1_000_000_000
MB = 1_000_000


@dataclass(frozen=True)
class DatasetSpec:
    name: str  # the data.dataset value
    url: str
    md5: str
    archive: str  # file name in the cache
    archive_bytes: int  # exact where published, else a rounded figure within 10%: a download stops past it
    # plus a margin (grlib.data.download.size_limit: 1% exact, 10% approximate, at least 1 MiB)
    extracted_bytes: int  # disk space the extracted archive needs (published figure)
    log_files: tuple[str, ...]  # inputs of the preprocessing, found anywhere under the extracted folder
    other_files: tuple[str, ...] = ()  # also in the archive (not used by the sequences)
    users: int = 0  # published counts (standard logs)
    items: int = 0
    interactions: int = 0
    log_format: str = "kuairand"  # kuairand (19-column CSV) | ml-100k (u.data)
    exact_size: bool = False  # archive_bytes is the exact size


ZENODO = "https://zenodo.org/records/10439422/files/"

DATASETS: dict[str, DatasetSpec] = {
    "kuairand-pure": DatasetSpec(
        name="kuairand-pure", url=ZENODO + "KuaiRand-Pure.tar.gz", md5="0820331067a3784d9691136f772b35a7",
        archive="KuaiRand-Pure.tar.gz", archive_bytes=47 * MB, extracted_bytes=194 * MB,
        log_files=("log_standard_4_08_to_4_21_pure.csv", "log_standard_4_22_to_5_08_pure.csv"),
        other_files=("log_random_4_22_to_5_08_pure.csv", "user_features_pure.csv",
                     "video_features_basic_pure.csv", "video_features_statistic_pure.csv"),
        users=27_285, items=7_551, interactions=1_436_609),
    "kuairand-1k": DatasetSpec(
        name="kuairand-1k", url=ZENODO + "KuaiRand-1K.tar.gz", md5="6b0b9c8222d67fcd4c676218edca3f1f",
        archive="KuaiRand-1K.tar.gz", archive_bytes=1_100 * MB, extracted_bytes=4_300 * MB,
        log_files=("log_standard_4_08_to_4_21_1k.csv", "log_standard_4_22_to_5_08_1k.csv"),
        other_files=("log_random_4_22_to_5_08_1k.csv", "user_features_1k.csv",
                     "video_features_basic_1k.csv", "video_features_statistic_1k.csv"),
        users=1_000, items=4_369_953, interactions=11_713_045),
    "kuairand-27k": DatasetSpec(
        name="kuairand-27k", url=ZENODO + "KuaiRand-27K.tar.gz", md5="3e3c799a24e2d23a4d2c757fbf9adf59",
        archive="KuaiRand-27K.tar.gz", archive_bytes=9_892_191_178, exact_size=True, extracted_bytes=46 * GB,
        log_files=("log_standard_4_08_to_4_21_27k_part1.csv", "log_standard_4_08_to_4_21_27k_part2.csv",
                   "log_standard_4_22_to_5_08_27k_part1.csv", "log_standard_4_22_to_5_08_27k_part2.csv"),
        other_files=("log_random_4_22_to_5_08_27k.csv", "user_features_27k.csv", "video_features_basic_27k.csv",
                     "video_features_statistic_27k_part1.csv", "video_features_statistic_27k_part2.csv",
                     "video_features_statistic_27k_part3.csv"),
        users=27_285, items=32_038_725, interactions=322_278_385),
    "ml-100k": DatasetSpec(
        name="ml-100k", url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
        md5="0e33842e24a9c977be4e0107933c0723", archive="ml-100k.zip", archive_bytes=5 * MB,
        extracted_bytes=16 * MB, log_files=("u.data",), other_files=("u.item", "u.user", "README"),
        users=943, items=1_682, interactions=100_000, log_format="ml-100k"),
}


def get(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; registered: {', '.join(DATASETS)}")
    return DATASETS[name]
