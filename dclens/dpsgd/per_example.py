"""Per-example gradients of a Keras classifier, flattened to one [B, P] matrix.

Two implementations of the same quantity -- row i is the gradient of example i's own loss
with respect to ``model.trainable_variables``, concatenated in that order:

* :func:`by_layer` (the fast path, for sequential stacks of ``Conv2D`` / ``Dense`` and
  parameter-free layers): one batched forward and backward pass gives every weighted
  layer's input h and the gradient dz of the summed loss with respect to its
  pre-activation output z.  Since examples do not mix, row i of dz is example i's own.
  The weight gradient of a linear map is then an outer product per example:
  ``dW_i = h_i^T dz_i`` for ``Dense`` and ``dK_i = sum_(p,q) patch_i(p,q)^T dz_i(p,q)`` for
  ``Conv2D`` (the patches are the receptive fields ``tf.image.extract_patches`` takes with
  the layer's kernel size, strides, dilation and padding); bias gradients are dz_i summed
  over positions.  Cost: about two forward passes plus the outer products.
* :func:`vectorized` (any model whose examples do not mix): each example's own tape under
  ``tf.vectorized_map``.  TensorFlow has no vectorised rule for ``Conv2DBackpropFilter``,
  so for conv nets it falls back to a loop inside the graph; it is the reference the fast
  path is tested against (with a plain Python loop in the tests).

:func:`per_example_gradients` takes the fast path when the model allows it.  Neither
allows layers that mix examples (batch norm in training mode).
"""

from __future__ import annotations

import keras
import tensorflow as tf

#: Layers without weights that act on each example alone; the fast path calls them as is.
_PARAMETER_FREE = (keras.layers.ZeroPadding2D, keras.layers.MaxPooling2D,
                   keras.layers.AveragePooling2D, keras.layers.Flatten,
                   keras.layers.Activation, keras.layers.ReLU, keras.layers.Reshape)


def supports_by_layer(model) -> bool:
    """Whether :func:`by_layer` handles ``model``: a ``keras.Sequential`` of channels-last,
    ungrouped ``Conv2D``, ``Dense`` on flat inputs, and the parameter-free layers."""
    if not isinstance(model, keras.Sequential):
        return False
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            if (type(layer) is not keras.layers.Conv2D or layer.groups != 1
                    or layer.data_format != "channels_last"):
                return False
        elif isinstance(layer, keras.layers.Dense):
            if type(layer) is not keras.layers.Dense:
                return False
        elif not isinstance(layer, _PARAMETER_FREE) or layer.trainable_weights:
            return False
    return True


def _conv_pre_activation(layer, h):
    # tf.nn.convolution, as Keras' TF backend: it handles dilation by space-to-batch where
    # the CPU kernel cannot (without oneDNN, Conv2D has no dilated input gradient).
    z = tf.nn.convolution(h, layer.kernel, strides=layer.strides,
                          padding=layer.padding.upper(), dilations=layer.dilation_rate)
    return z + layer.bias if layer.use_bias else z


def _conv_kernel_gradients(layer, h, dz):
    """[B, kh, kw, c_in, c_out]: each example's kernel gradient from its receptive fields."""
    kh, kw = layer.kernel_size
    patches = tf.image.extract_patches(
        h, sizes=[1, kh, kw, 1], strides=[1, *layer.strides, 1],
        rates=[1, *layer.dilation_rate, 1], padding=layer.padding.upper())
    grads = tf.einsum("bhwp,bhwf->bpf", patches, dz)
    return tf.reshape(grads, [-1, *layer.kernel.shape])


def by_layer(model, loss_fn, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Every example's gradient of its own loss, flattened: [B, P] (see the module doc).

    ``loss_fn(labels, outputs)`` must return one loss per example.  Raises ``ValueError``
    for a model :func:`supports_by_layer` refuses.
    """
    if not supports_by_layer(model):
        raise ValueError(f"model {model.name!r} is not a Sequential of Conv2D / Dense / "
                         f"parameter-free layers; use per_example.vectorized")
    images = tf.convert_to_tensor(images, tf.float32)
    weighted = []                                   # (layer, its input, its pre-activation)
    with tf.GradientTape() as tape:
        h = images
        for layer in model.layers:
            if isinstance(layer, keras.layers.Conv2D):
                z = _conv_pre_activation(layer, h)
            elif isinstance(layer, keras.layers.Dense):
                z = tf.matmul(h, layer.kernel)
                z = z + layer.bias if layer.use_bias else z
            else:
                h = layer(h, training=False)
                continue
            tape.watch(z)
            weighted.append((layer, h, z))
            h = layer.activation(z)
        loss = tf.reduce_sum(loss_fn(labels, h))
    output_grads = tape.gradient(loss, [z for _, _, z in weighted])
    by_variable = {}
    for (layer, h, _), dz in zip(weighted, output_grads):
        if isinstance(layer, keras.layers.Conv2D):
            by_variable[id(layer.kernel)] = _conv_kernel_gradients(layer, h, dz)
            bias = tf.reduce_sum(dz, axis=[1, 2])
        else:
            by_variable[id(layer.kernel)] = tf.einsum("bi,bj->bij", h, dz)
            bias = dz
        if layer.use_bias:
            by_variable[id(layer.bias)] = bias
    batch = tf.shape(images)[0]
    return tf.concat([tf.reshape(by_variable[id(v)], [batch, -1])
                      for v in model.trainable_variables], axis=1)


def vectorized(model, loss_fn, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Every example's gradient of its own loss, flattened: [B, P], each example's own
    forward and backward pass under ``tf.vectorized_map`` (no Python loop; O(B P) memory).

    (The Jacobian of the batch's B losses would backpropagate through the whole batch once
    per example: O(B^2) activations, out of memory at B = 512.)
    """
    variables = model.trainable_variables

    def one(example):
        x, y = example
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(y[None], model(x[None], training=False)))
        grads = tape.gradient(loss, variables)
        return tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)

    return tf.vectorized_map(one, (tf.convert_to_tensor(images), tf.convert_to_tensor(labels)))


def per_example_gradients(model, loss_fn, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """[B, P] per-example gradients: :func:`by_layer` when the model allows it, else
    :func:`vectorized`.  ``loss_fn`` returns one loss per example; the model must not mix
    examples (no batch norm in training mode)."""
    if supports_by_layer(model):
        return by_layer(model, loss_fn, images, labels)
    return vectorized(model, loss_fn, images, labels)
