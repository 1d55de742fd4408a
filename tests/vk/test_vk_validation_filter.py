"""The validation channel ignores exactly the old layer's cooperative-matrix messages, and
only while the layer predates VK_KHR_cooperative_matrix (1.3.255)."""

from pootvk.vk import validation

DEVICE_MSG = ("[VUID-VkDeviceCreateInfo-pNext-pNext] vkCreateDevice: pCreateInfo->pNext chain "
              "includes a structure with unknown VkStructureType (1000506000); Allowed ...")
SHADER_MSG = "[UNASSIGNED-CoreValidation-Shader-InconsistentSpirv] SPIR-V module not valid: " \
    "Invalid capability operand: 6022"
OTHER_MSG = "[VUID-vkCmdDispatch-None-02697] descriptor set 0 is not bound"


def test_only_the_old_layers_coopmat_messages_are_ignored():
    saved = validation._layer_version
    try:
        validation.set_layer_version((1, 3, 239))
        assert validation.is_false_alarm(DEVICE_MSG) and validation.is_false_alarm(SHADER_MSG)
        assert not validation.is_false_alarm(OTHER_MSG)
        validation.set_layer_version((1, 3, 255))  # a layer that knows the extension
        assert not validation.is_false_alarm(DEVICE_MSG)
        assert not validation.is_false_alarm(SHADER_MSG)
        validation.set_layer_version(None)  # type: ignore[arg-type]  # no layer enabled
        assert not validation.is_false_alarm(DEVICE_MSG)
    finally:
        validation._layer_version = saved
