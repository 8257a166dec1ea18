"""The upstream half: a lean HTTP/1.1 client for the pool's backends and one call through it, streamed or not.
"""
