"""Features on controlled degradations of real photographs (scikit-image's bundled images).

Each run takes a fresh random 640x480 crop of each photograph; the degradation levels are fixed.
"""
import cv2
import numpy as np
import pytest

from edgefm_ros.routing.features import (FEATURE_NAMES, FeatureConfig, VISUAL_NAMES, aggregate, extract_features,
                                         jpeg_quality, read_dqt, text_features, visual_features)
from skips import require_module

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
BLUR, EXPOSURE, JPEG, DETAIL = range(4)


def crop(name: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 (480, 640, 3): a random crop of the photograph scaled to 720 wide."""
    skdata = require_module("skimage.data", "scikit-image (bundled test photographs) is not installed")
    img = getattr(skdata, name)()
    h, w = img.shape[:2]
    big = cv2.resize(img, (720, max(540, round(h * 720 / w))), interpolation=cv2.INTER_AREA)
    y = int(rng.integers(0, big.shape[0] - 480 + 1))
    x = int(rng.integers(0, big.shape[1] - 640 + 1))
    return np.ascontiguousarray(big[y:y + 480, x:x + 640])


def encode(rgb: np.ndarray, q: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(rgb[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, q])
    assert ok
    return buf.tobytes()


def decode(data: bytes) -> np.ndarray:
    return np.ascontiguousarray(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1])


@pytest.fixture(params=PHOTOS)
def photo(request):
    rng = np.random.default_rng()
    return crop(request.param, rng)


def sweep(images):
    return np.stack([visual_features(im) for im in images])  # (levels, 4)


def assert_own_moves_others_still(f: np.ndarray, own: int, min_rise: float, tol: float, increasing=True):
    col = f[:, own] if increasing else -f[:, own]
    assert np.all(np.diff(col) > 0), f"{VISUAL_NAMES[own]} not strictly monotonic: {f[:, own]}"
    assert col[-1] - col[0] >= min_rise, f"{VISUAL_NAMES[own]} moved only {col[-1] - col[0]:.3f}: {f[:, own]}"
    for k in range(4):
        if k != own:
            spread = f[:, k].max() - f[:, k].min()
            assert spread <= tol, f"{VISUAL_NAMES[k]} moved {spread:.3f} under {VISUAL_NAMES[own]}: {f[:, k]}"


def test_gaussian_blur_moves_blur_only(photo):
    f = sweep([photo] + [cv2.GaussianBlur(photo, (0, 0), s) for s in (1.0, 2.0, 4.0)])
    assert_own_moves_others_still(f, BLUR, min_rise=0.2, tol=0.1)


@pytest.mark.parametrize("kind", ["gain", "gamma"])
def test_exposure_moves_exposure_only(photo, kind):
    x = photo.astype(np.float32) / 255.0
    if kind == "gain":
        levels = [np.clip(x * g, 0, 1) for g in (0.4, 0.6, 0.8, 1.0, 1.25)]
    else:
        levels = [x ** g for g in (2.2, 1.6, 1.0, 0.7, 0.5)]
    f = sweep([(255 * im + 0.5).astype(np.uint8) for im in levels])
    assert_own_moves_others_still(f, EXPOSURE, min_rise=0.3, tol=0.12)


def test_jpeg_quality_moves_jpeg_only(photo):
    qualities = (90, 50, 30, 15, 8)
    f = sweep([decode(encode(photo, q)) for q in qualities])  # pixels only: blockiness
    assert np.all(np.diff(f[:, JPEG]) > 0), f"blockiness not increasing with compression: {f[:, JPEG]}"
    assert f[-1, JPEG] - f[0, JPEG] >= 0.2
    for k in (BLUR, EXPOSURE, DETAIL):
        assert np.ptp(f[:, k]) <= 0.08, f"{VISUAL_NAMES[k]} moved under JPEG: {f[:, k]}"
    fb = sweep([encode(photo, q) for q in qualities])  # JPEG bytes: quality from the DQT
    np.testing.assert_allclose(fb[:, JPEG], [(100 - q) / 100 for q in qualities], atol=1e-6)
    np.testing.assert_allclose(fb[:, [BLUR, EXPOSURE, DETAIL]], f[:, [BLUR, EXPOSURE, DETAIL]], atol=0.03)


def test_block_edges_do_not_read_as_sharpness(photo):
    """A blurred image compressed hard stays blurred: differences across block boundaries are left out."""
    soft = cv2.GaussianBlur(photo, (0, 0), 3.0)
    plain = visual_features(soft)[BLUR]
    blocky = visual_features(decode(encode(soft, 8)))[BLUR]
    assert abs(blocky - plain) < 0.05, (plain, blocky)


def test_features_do_not_depend_on_camera_resolution(photo):
    big = cv2.resize(photo, (1280, 960), interpolation=cv2.INTER_CUBIC)
    np.testing.assert_allclose(visual_features(big), visual_features(photo), atol=0.04)


def test_jpeg_quality_from_quantisation_tables_is_exact():
    rng = np.random.default_rng()
    img = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    for q in sorted(set(rng.integers(1, 101, 25).tolist()) | {1, 50, 100}):
        data = encode(img, q)
        assert jpeg_quality(data) == q
        tables = read_dqt(data)
        assert set(tables) == {0, 1} and all(t.shape == (64,) for t in tables.values())


def test_dqt_rejects_non_jpeg_and_truncated():
    rng = np.random.default_rng()
    with pytest.raises(ValueError, match="not a JPEG"):
        jpeg_quality(rng.integers(1, 255, 100, dtype=np.uint8).tobytes())
    data = encode(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), 70)
    dqt = data.index(b"\xff\xdb")
    with pytest.raises(ValueError):
        read_dqt(data[:dqt + 30])


def test_bad_images_are_rejected_with_the_value_named():
    with pytest.raises(ValueError, match="uint8"):
        visual_features(np.random.default_rng().random((4, 5, 3)))  # float64
    rng = np.random.default_rng()
    with pytest.raises(ValueError, match="DQT|JPEG|decode"):
        visual_features(b"\xff\xd8\xff\xdb\x00\x03\x00\xff\xd9")
    with pytest.raises(ValueError, match="decode"):
        visual_features(b"\x89PNG" + rng.integers(0, 256, 64, dtype=np.uint8).tobytes())
    ok, png = cv2.imencode(".png", rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))
    assert visual_features(png.tobytes()).shape == (4,)
    with pytest.raises(ValueError, match="at least one camera"):
        extract_features({}, "pick")


def test_multi_camera_aggregation_follows_config(photo):
    blurred = cv2.GaussianBlur(photo, (0, 0), 4.0)
    dark = (photo * 0.3).astype(np.uint8)
    per = np.stack([visual_features(im) for im in (photo, blurred, dark)])
    f = extract_features({"a": photo, "b": blurred, "c": dark}, "pick up the cube")
    assert f.shape == (len(FEATURE_NAMES),) and f.dtype == np.float32
    assert f[BLUR] == pytest.approx(per[:, BLUR].max())
    assert f[EXPOSURE] == pytest.approx(per[np.argmax(np.abs(per[:, EXPOSURE])), EXPOSURE])
    mean_cfg = FeatureConfig(aggregate=(("blur", "mean"), ("exposure", "min"), ("jpeg", "max"), ("detail", "min")))
    g = aggregate(per, mean_cfg)
    assert g[BLUR] == pytest.approx(per[:, BLUR].mean()) and g[DETAIL] == pytest.approx(per[:, DETAIL].min())
    with pytest.raises(ValueError, match="median"):
        FeatureConfig(aggregate=(("blur", "median"), ("exposure", "min"), ("jpeg", "max"), ("detail", "min")))


def test_text_features():
    t = {n: i for i, n in enumerate(FEATURE_NAMES[4:])}
    cmd = text_features("pick up the red cube")
    q = text_features("Which cup is closer to the robot?")
    assert cmd[t["text_question"]] == 0.0 and q[t["text_question"]] == 1.0
    hard = text_features("If the second drawer is empty, then put it back where the other one was before")
    assert hard[t["text_reasoning"]] == 1.0 and cmd[t["text_reasoning"]] == 0.0
    assert hard[t["text_deictic"]] > 0.5 and cmd[t["text_deictic"]] == 0.0
    assert hard[t["text_length"]] > cmd[t["text_length"]]
    ent = text_features("move 3 blocks 20 cm towards Alice and read the label \"B-12\"")
    assert ent[t["text_entity"]] > 0.3 and cmd[t["text_entity"]] == 0.0
    lex = text_features("disassemble the electrical connector carefully")
    assert lex[t["text_lexical"]] > cmd[t["text_lexical"]]
    assert np.all(text_features("") == 0) and np.all((hard >= 0) & (hard <= 1))
    with pytest.raises(ValueError, match="str"):
        text_features(None)
