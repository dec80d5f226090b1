pat_str = r"""[a&&[b]"""
