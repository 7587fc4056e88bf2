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


def test_duplicate_record_ids_are_named(tiny):
    ds = dataclasses.replace(tiny, record_ids=["d", "a", "c", "a"])
    with pytest.raises(DatasetError, match=r"record_id: duplicate 'a' at indices 1 and 3"):
        validate(ds)


def test_empty_record_id_is_rejected(tiny):
    ds = dataclasses.replace(tiny, record_ids=["d", "", "c", "b"])
    with pytest.raises(DatasetError, match=r"record_id: '' at index 1"):
        validate(ds)


def test_labels_out_of_range_name_the_record_and_value(tiny):
    ds = dataclasses.replace(tiny, labels=np.array([0, 2, 12, 1]))
    with pytest.raises(DatasetError, match=r"label: values out of range \[0, 2\]: found 12 at record_id 'c'"):
        validate(ds)
    ds = dataclasses.replace(tiny, labels=np.array([0, -1, 1, 1]))
    with pytest.raises(DatasetError, match=r"label: .*found -1 at record_id 'a'"):
        validate(ds)


def test_caller_num_classes_is_enforced(tiny, mnist):
    with pytest.raises(DatasetError, match=r"label: values out of range \[0, 1\]: found 2 at record_id 'a'"):
        validate(tiny, num_classes=2)
    with pytest.raises(DatasetError, match=r"num_classes: 11 required but the dataset declares 10"):
        validate(mnist, num_classes=11)
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
    with pytest.raises(DatasetError, match=r"record_id: 3 ids but 4 images"):
        validate(dataclasses.replace(tiny, record_ids=tiny.record_ids[:3]))
    with pytest.raises(DatasetError, match=r"split: 2 entries but 4 images"):
        validate(dataclasses.replace(tiny, splits=["train", "test"]))


def test_split_names_must_be_non_empty_strings(tiny):
    with pytest.raises(DatasetError, match=r"split: '' .*record_id 'a'"):
        validate(dataclasses.replace(tiny, splits=["train", "", None, None]))
