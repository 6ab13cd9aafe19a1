"""QR codes as PNG ``data:`` URIs (the ``qrcode`` package, pure-Python PNG writer)."""

from __future__ import annotations

import base64
import io


def png_data_uri(text: str) -> str:
    """A PNG QR code of ``text`` as a ``data:`` URI. Not cached: callers cache what is not secret."""
    import qrcode
    import qrcode.image.pure

    image = qrcode.make(text, image_factory=qrcode.image.pure.PyPNGImage, border=2, box_size=6)
    buffer = io.BytesIO()
    image.save(buffer)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
