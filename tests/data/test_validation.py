import dataclasses

import numpy as np
import pytest

from dpsynth.data import validate
from dpsynth.errors import DatasetError


def test_a_well_formed_dataset_passes(tiny, mnist):
    validate(tiny)
    validate(mnist, num_classes=10)


def test_empty_dataset_is_rejected(tiny):
    empty = tiny.subset(np.zeros(len(tiny), bool))
    with pytest.raises(DatasetError, match="empty"):
        validate(empty)


def refused(exc_info, *values) -> str:
    """The refusal's message, which names the field and the check, never a value read from the data (#52 item 3):
    none of ``values`` (record ids, labels, counts the data declares) appears in it."""
    text = str(exc_info.value)
    shown = [v for v in values if (repr(v) if isinstance(v, str) and len(v) < 3 else str(v)) in text]  # 'a' quoted
    assert not shown, text
    return text


def test_duplicate_record_ids_are_refused_without_naming_them(tiny):
    ds = dataclasses.replace(tiny, record_ids=["dup-x", "dup-y", "dup-z", "dup-y"])
    with pytest.raises(DatasetError, match=r"record_id: two records share an id") as e:
        validate(ds)
    refused(e, "dup-y", "indices", " 1 ", " 3")


def test_empty_record_id_is_rejected(tiny):
    ds = dataclasses.replace(tiny, record_ids=["d", "", "c", "b"])
    with pytest.raises(DatasetError, match=r"record_id: a record's id is not a non-empty string") as e:
        validate(ds)
    refused(e, "index 1")


def test_labels_out_of_range_are_refused_without_the_record_or_its_value(tiny):
    ds = dataclasses.replace(tiny, labels=np.array([0, 2, 12, 1]))
    with pytest.raises(DatasetError, match=r"label: a record's label lies outside the label set \[0, 2\]") as e:
        validate(ds)
    refused(e, "12", *ds.record_ids)
    ds = dataclasses.replace(tiny, labels=np.array([0, -1, 1, 1]))
    with pytest.raises(DatasetError, match=r"label: a record's label lies outside") as e:
        validate(ds)
    refused(e, "-1", *ds.record_ids)


def test_caller_num_classes_is_enforced(tiny, mnist):
    with pytest.raises(DatasetError, match=r"label: a record's label lies outside the label set \[0, 1\]") as e:
        validate(tiny, num_classes=2)
    refused(e, *tiny.record_ids)
    with pytest.raises(DatasetError, match=r"num_classes: 11 required, but the dataset declares another") as e:
        validate(mnist, num_classes=11)
    refused(e, "10")  # the declared count is max(label) + 1 for imported data: what the label-set fix hides
    with pytest.raises(DatasetError, match="num_classes"):
        validate(dataclasses.replace(tiny, num_classes=0))


def test_float_labels_are_rejected(tiny):
    ds = dataclasses.replace(tiny, labels=np.array([0.0, 2.0, 1.0, 2.0]))
    with pytest.raises(DatasetError, match=r"label: dtype float64 is not an integer type"):
        validate(ds)


def test_images_must_be_4d_uint8(tiny):
    with pytest.raises(DatasetError, match=r"image: expected a 4-D uint8 array.*float32"):
        validate(dataclasses.replace(tiny, images=tiny.images.astype(np.float32)))
    with pytest.raises(DatasetError, match=r"image: expected a 4-D uint8 array.*\(4, 2, 3\)"):
        validate(dataclasses.replace(tiny, images=tiny.images[..., 0]))


def test_lengths_must_agree(tiny):
    with pytest.raises(DatasetError, match=r"label: expected shape \(4,\)"):
        validate(dataclasses.replace(tiny, labels=tiny.labels[:3]))
    with pytest.raises(DatasetError, match=r"record_id: not one id per image"):
        validate(dataclasses.replace(tiny, record_ids=tiny.record_ids[:3]))
    with pytest.raises(DatasetError, match=r"split: 2 entries but 4 images"):
        validate(dataclasses.replace(tiny, splits=["train", "test"]))


def test_split_names_must_be_non_empty_strings(tiny):
    with pytest.raises(DatasetError, match=r"split: a record's split is not a non-empty string or None"):
        validate(dataclasses.replace(tiny, splits=["train", "", None, None]))
