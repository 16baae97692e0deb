import os
import subprocess
import sys

from poot_wgpu import probe


def test_probe_reports_a_vulkan_adapter(wgpu_device):
    found = probe()
    assert found.available, found.reason
    (info,) = found.devices
    assert info.backend_type == "Vulkan"
    assert info.name in str(found)
    assert wgpu_device.limit("max-storage-buffer-binding-size") > 0


def _probe_in_subprocess(**env_overrides) -> str:
    env = dict(os.environ, **env_overrides)
    code = "import poot_wgpu; r = poot_wgpu.probe(); print('REASON', r.available, r.reason)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return out[out.index("REASON"):]


def test_probe_refuses_the_opengl_fallback_by_name():
    reason = _probe_in_subprocess(WGPU_BACKEND_TYPE="OpenGL")
    assert reason.startswith("REASON False no wgpu device")
    assert "OpenGL" in reason


def test_probe_states_why_when_no_vulkan_driver_loads():
    reason = _probe_in_subprocess(VK_ICD_FILENAMES="/nonexistent/icd.json",
                                  VK_DRIVER_FILES="/nonexistent/icd.json")
    assert reason.startswith("REASON False no wgpu device: ")
    assert "lavapipe" in reason
