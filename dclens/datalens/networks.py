"""The conditional DCGAN generator and teacher discriminator of DataLens as Keras 3 models.

Architecture (docs/design.md, the DCGAN-tensorflow conditional variant used by the
authors): labels are one-hot and concatenated to the input, to every hidden feature map
(broadcast over height and width) and to the dense layers.  Batch normalisation uses
epsilon 1e-5 and momentum 0.9; weights are initialised from N(0, 0.02) (truncated for
convolutions), biases at zero; leaky ReLU slope 0.2.

Teacher discriminator (H x W x C image, K classes; df = 32, dfc = 256: the authors'
``df_dim`` and ``dfc_dim``; other widths are an option beyond the paper,
:class:`DiscriminatorWidth`)::

    [x, y-maps]                      H x W x (C+K)
    conv5x5/2 -> C+K ch, lrelu       H/2 x W/2 x (C+K)
    [., y-maps]                      H/2 x W/2 x (C+2K)
    conv5x5/2 -> df+K ch, BN, lrelu  H/4 x W/4 x (df+K)
    flatten, [., y]                  (H/4)(W/4)(df+K) + K
    dense dfc, BN, lrelu, [., y]     dfc + K
    dense 1                          logit

Generator (gf = 64, gfc = 1024: the authors' ``gf_dim`` and ``gfc_dim``; other widths are
an option beyond the paper, :func:`build_generator`'s ``filters`` and ``dense``)::

    [z, y] -> dense gfc, BN, relu, [., y]
    dense 2*gf*(H/4)*(W/4), BN, relu, reshape H/4 x W/4 x 2gf, [., y-maps]
    deconv5x5/2 -> 2gf ch, BN, relu, [., y-maps]
    deconv5x5/2 -> C ch, sigmoid      H x W x C in [0, 1]

Beyond the paper (issue 39, ``upsampling="resize"``): each stride-2 transposed
convolution becomes a nearest-neighbour 2x upsampling followed by a stride-1 5x5
convolution of the same channels (a resize-convolution).  A stride-2 transposed 5x5
convolution gives even and odd output positions 3 and 2 kernel taps, an uneven overlap
that prints a checkerboard on the images (Odena, Dumoulin and Olah, "Deconvolution and
Checkerboard Artifacts", Distill 2016); after a nearest-neighbour resize every output
position sees the same 25 taps.  It costs about 4x the multiply-adds of those two layers.
``upsampling="transpose4"`` keeps learned transposed convolutions but with a 4x4 kernel,
a multiple of the stride: every output position sees 2 x 2 taps (an even overlap, no
resize's smoothing), which separates the checkerboard from the low-pass of a resize.

The teacher ensemble (:mod:`dclens.datalens.teachers`) evaluates the same discriminator for many
teachers at once from stacked weights; :func:`discriminator_weight_shapes` is the contract
between the two (names and shapes in Keras' weight order).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras import layers

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9
LEAKY_SLOPE = 0.2
INIT_STDDEV = 0.02
DISCRIMINATOR_FILTERS = 32   # df_dim (the default of DiscriminatorWidth)
DISCRIMINATOR_DENSE = 256    # dfc_dim
GENERATOR_FILTERS = 64       # gf_dim
GENERATOR_DENSE = 1024       # gfc_dim
#: The generator's layers with weights, in build order (the authors' transposed
#: convolutions; :func:`generator_layers` names them for either upsampling).
GENERATOR_LAYERS = ("g_h0_lin", "g_h1_lin", "g_h2_deconv", "g_h3_deconv")
#: How the generator doubles its feature maps' height and width: the authors' stride-2
#: 5x5 transposed convolutions, a nearest-neighbour resize then a convolution, or stride-2
#: 4x4 transposed convolutions (the last two beyond the paper; :func:`upsampling_layers`).
UPSAMPLINGS = ("transpose", "resize", "transpose4")


def check_width(label: str, value: object, default: int) -> int:
    """``value`` as an int if it is an integer >= 1, else a ValueError naming it and the
    authors' ``default``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{label} must be an integer >= 1 (the authors': {default}), "
                         f"got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class DiscriminatorWidth:
    """The teacher discriminator's width: ``filters`` (df) and ``dense`` (dfc) units.

    The second convolution has df + K output channels and the hidden dense layer dfc units;
    the first convolution's C + K channels do not depend on it.  The default is the
    authors' (df_dim 32, dfc_dim 256); any other is beyond the paper.  The width is
    data-independent: it changes what each teacher computes, never which records it
    reads, so the votes' sensitivity and the ledger are the same for every width.
    """

    filters: int = DISCRIMINATOR_FILTERS
    dense: int = DISCRIMINATOR_DENSE

    def __post_init__(self) -> None:
        check_width("teacher filters (df_dim)", self.filters, DISCRIMINATOR_FILTERS)
        check_width("teacher dense units (dfc_dim)", self.dense, DISCRIMINATOR_DENSE)

    @property
    def is_paper(self) -> bool:
        return self == DiscriminatorWidth()


@dataclasses.dataclass(frozen=True)
class ImageShape:
    """Height, width, channels and number of label classes of a dataset."""

    height: int
    width: int
    channels: int
    num_classes: int

    def __post_init__(self) -> None:
        if self.height % 4 or self.width % 4:
            raise ValueError(f"image height and width must be multiples of 4 (two stride-2 "
                             f"layers), got {self.height}x{self.width}")

    @property
    def dim(self) -> int:
        return self.height * self.width * self.channels


@keras.saving.register_keras_serializable(package="dclens")
class ConcatLabelMaps(layers.Layer):
    """Concatenates a one-hot label [B, K] to a feature map [B, H, W, C] as K constant maps."""

    def call(self, inputs):
        features, labels = inputs
        shape = keras.ops.shape(features)
        maps = keras.ops.broadcast_to(
            keras.ops.reshape(labels, (shape[0], 1, 1, -1)),
            (shape[0], shape[1], shape[2], keras.ops.shape(labels)[-1]))
        return keras.ops.concatenate([features, keras.ops.cast(maps, features.dtype)], axis=-1)

    def compute_output_shape(self, input_shape):
        features, labels = input_shape
        return (*features[:-1], features[-1] + labels[-1])


def layer_seeds(seed: int | None, names: tuple[str, ...]) -> dict[str, int | None]:
    """One independent initializer seed per named layer, derived from ``seed``.

    Keras' seeded initializers are deterministic per call: one seeded initializer shared by
    two layers gives them the same leading values (e.g. a dense kernel equal to the first
    rows of the next one).  Every layer therefore gets its own seed, spawned from ``seed``
    with :class:`numpy.random.SeedSequence` (``None`` stays ``None``: Keras then draws
    fresh, independent values for every layer).
    """
    if seed is None:
        return {name: None for name in names}
    states = np.random.SeedSequence(seed).generate_state(len(names), np.uint32)
    return {name: int(state >> 1) for name, state in zip(names, states)}


def _batch_norm(name: str) -> layers.BatchNormalization:
    return layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=name)


def build_discriminator(shape: ImageShape, *, seed: int | None = None,
                        width: DiscriminatorWidth = DiscriminatorWidth(),
                        name: str = "teacher_discriminator") -> keras.Model:
    """One teacher discriminator: inputs [image, one-hot label], output the logit [B, 1].

    ``width`` sets df and dfc (default the authors').  Every layer's initializer has its
    own seed (:func:`layer_seeds`)."""
    seeds = layer_seeds(seed, ("d_h0_conv", "d_h1_conv", "d_h2_lin", "d_h3_lin"))

    def conv_init(name):
        return keras.initializers.TruncatedNormal(stddev=INIT_STDDEV, seed=seeds[name])

    def dense_init(name):
        return keras.initializers.RandomNormal(stddev=INIT_STDDEV, seed=seeds[name])
    k = shape.num_classes
    image = keras.Input((shape.height, shape.width, shape.channels), name="image")
    label = keras.Input((k,), name="label")
    h = ConcatLabelMaps(name="concat_y0")([image, label])
    h = layers.Conv2D(shape.channels + k, 5, strides=2, padding="same",
                      kernel_initializer=conv_init("d_h0_conv"), name="d_h0_conv")(h)
    h = layers.LeakyReLU(LEAKY_SLOPE)(h)
    h = ConcatLabelMaps(name="concat_y1")([h, label])
    h = layers.Conv2D(width.filters + k, 5, strides=2, padding="same",
                      kernel_initializer=conv_init("d_h1_conv"), name="d_h1_conv")(h)
    h = _batch_norm("d_bn1")(h)
    h = layers.LeakyReLU(LEAKY_SLOPE)(h)
    h = layers.Flatten()(h)
    h = layers.Concatenate()([h, label])
    h = layers.Dense(width.dense, kernel_initializer=dense_init("d_h2_lin"),
                     name="d_h2_lin")(h)
    h = _batch_norm("d_bn2")(h)
    h = layers.LeakyReLU(LEAKY_SLOPE)(h)
    h = layers.Concatenate()([h, label])
    logit = layers.Dense(1, kernel_initializer=dense_init("d_h3_lin"),
                         name="d_h3_lin")(h)
    return keras.Model([image, label], logit, name=name)


def check_upsampling(upsampling: object) -> str:
    """``upsampling`` if it is one of :data:`UPSAMPLINGS`, else a ValueError naming it."""
    if upsampling not in UPSAMPLINGS:
        raise ValueError(f"generator upsampling must be one of {list(UPSAMPLINGS)} "
                         f"('transpose': the authors' transposed convolutions), got "
                         f"{upsampling!r}")
    return str(upsampling)


def generator_layers(upsampling: str = "transpose") -> tuple[str, ...]:
    """The generator's layers with weights, in build order: the two dense layers, then the
    two upsampling layers (``g_h2_deconv``, ``g_h3_deconv`` for transposed convolutions;
    ``g_h2_conv``, ``g_h3_conv`` for resize-convolutions)."""
    suffix = "conv" if check_upsampling(upsampling) == "resize" else "deconv"
    return ("g_h0_lin", "g_h1_lin", f"g_h2_{suffix}", f"g_h3_{suffix}")


def upsampling_layers(upsampling: str, channels: int, initializer, name: str
                      ) -> list[layers.Layer]:
    """The layers that double a feature map's height and width into ``channels``.

    ``transpose`` (the authors'): one stride-2 5x5 transposed convolution (output
    positions see 3 x 3, 3 x 2 or 2 x 2 taps by their parity).  ``resize``: a
    nearest-neighbour 2x upsampling, then a stride-1 5x5 convolution ("same" padding), so
    every output position sees the same 25 kernel taps.  ``transpose4``: one stride-2 4x4
    transposed convolution, every output position 2 x 2 taps.
    """
    kind = check_upsampling(upsampling)
    if kind in ("transpose", "transpose4"):
        return [layers.Conv2DTranspose(channels, 5 if kind == "transpose" else 4, strides=2,
                                       padding="same", kernel_initializer=initializer,
                                       name=name)]
    return [layers.UpSampling2D(2, interpolation="nearest", name=f"{name}_resize"),
            layers.Conv2D(channels, 5, strides=1, padding="same",
                          kernel_initializer=initializer, name=name)]


def build_generator(shape: ImageShape, z_dim: int, *, seed: int | None = None,
                    filters: int = GENERATOR_FILTERS, dense: int = GENERATOR_DENSE,
                    upsampling: str = "transpose",
                    name: str = "generator") -> keras.Model:
    """The student generator: inputs [z, one-hot label], output images in [0, 1].

    ``filters`` (gf) and ``dense`` (gfc) set its width: the first dense layer has gfc units,
    the second 2 gf (H/4)(W/4), the first upsampling layer 2 gf channels.  The
    defaults are the authors' (64 and 1024).  ``upsampling`` (:data:`UPSAMPLINGS`): the
    authors' stride-2 5x5 transposed convolutions (the default), resize-convolutions or
    4x4 transposed convolutions (:func:`upsampling_layers`; beyond the paper,
    data-independent).

    Every layer's initializer has its own seed (:func:`layer_seeds`); before 2026-11 one
    seeded initializer was shared by the two dense and by the two transposed-convolution
    layers, which made ``g_h0_lin``'s kernel equal to the leading values of ``g_h1_lin``'s.
    """
    if z_dim < 1:
        raise ValueError(f"z_dim must be >= 1, got {z_dim!r}")
    check_width("generator filters", filters, GENERATOR_FILTERS)
    check_width("generator dense", dense, GENERATOR_DENSE)
    names = generator_layers(upsampling)
    seeds = layer_seeds(seed, names)

    def init(name):
        return keras.initializers.RandomNormal(stddev=INIT_STDDEV, seed=seeds[name])
    k = shape.num_classes
    h4, w4 = shape.height // 4, shape.width // 4
    z = keras.Input((z_dim,), name="z")
    label = keras.Input((k,), name="label")
    h = layers.Concatenate()([z, label])
    h = layers.Dense(dense, kernel_initializer=init("g_h0_lin"), name="g_h0_lin")(h)
    h = layers.ReLU()(_batch_norm("g_bn0")(h))
    h = layers.Concatenate()([h, label])
    h = layers.Dense(2 * filters * h4 * w4, kernel_initializer=init("g_h1_lin"),
                     name="g_h1_lin")(h)
    h = layers.ReLU()(_batch_norm("g_bn1")(h))
    h = layers.Reshape((h4, w4, 2 * filters))(h)
    h = ConcatLabelMaps(name="concat_y1")([h, label])
    for layer in upsampling_layers(upsampling, 2 * filters, init(names[2]), names[2]):
        h = layer(h)
    h = layers.ReLU()(_batch_norm("g_bn2")(h))
    h = ConcatLabelMaps(name="concat_y2")([h, label])
    for layer in upsampling_layers(upsampling, shape.channels, init(names[3]), names[3]):
        h = layer(h)
    image = layers.Activation("sigmoid", name="image")(h)
    return keras.Model([z, label], image, name=name)


def load_generator(path: str) -> keras.Model:
    """A generator saved by ``model.save(path)`` (its label-map layer registered)."""
    return keras.models.load_model(path, compile=False,
                                   custom_objects={"ConcatLabelMaps": ConcatLabelMaps})


def discriminator_weight_shapes(shape: ImageShape,
                                width: DiscriminatorWidth = DiscriminatorWidth()
                                ) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of one teacher's trainable weights, in Keras' weight order
    (``width``: df and dfc, default the authors').

    Convolution kernels are [5, 5, C_in, C_out]; dense kernels [in, out]; BN has gamma and
    beta.  The moving statistics of BN are not listed: teachers always normalise with
    batch statistics (as the authors' code does, for training and gradient queries).
    """
    k, c = shape.num_classes, shape.channels
    c0 = c + k
    c1 = width.filters + k
    dense = width.dense
    flat = (shape.height // 4) * (shape.width // 4) * c1 + k
    return [
        ("conv0/kernel", (5, 5, c + k, c0)), ("conv0/bias", (c0,)),
        ("conv1/kernel", (5, 5, c0 + k, c1)), ("conv1/bias", (c1,)),
        ("bn1/gamma", (c1,)), ("bn1/beta", (c1,)),
        ("dense2/kernel", (flat, dense)), ("dense2/bias", (dense,)),
        ("bn2/gamma", (dense,)), ("bn2/beta", (dense,)),
        ("dense3/kernel", (dense + k, 1)), ("dense3/bias", (1,)),
    ]
